"""Emulated networks on one machine: network namespaces joined by shaped veth links.

    >>> from trainsim.testbed.netns import Netns, netns_unavailable
    >>> if netns_unavailable() is None:                                   # doctest: +SKIP
    ...     with Netns(2, rate_mbit=100, delay_ms=5) as net:
    ...         out = net.run(0, ["python3", "-c", "print('hello from', 0)"])
    ...         worker = net.popen(1, ["python3", "server.py", "--bind", net.addr(1)])

Layout (``topology="star"``, the default): one *hub* namespace routes between N *node* namespaces;
node ``i`` has interface ``eth0`` with address ``10.213.i.2/24`` (private range, exists only inside
the namespaces made here) and a veth link to the hub. ``topology="bridge"`` puts the nodes on one
L2 bridge in the hub instead (``10.213.0.{i+1}/24``). Every link is shaped in both directions:

- rate: ``tbf`` on both ends of each veth, so each node has an up- and a down-link of ``rate_mbit``,
  with TCP's packets no larger than two fit in tbf's bucket (``gso_bytes``), so the shaper never cuts
  them into frames on the CPU (a NIC does that in hardware);
- delay: one-way latency ``delay_ms`` added between any two nodes (ping RTT grows by ``2 * delay_ms``),
  with ``netem`` on each node's egress when the kernel has it, otherwise with a small user-space delay
  line in the hub (a TUN device that holds each forwarded packet for ``delay_ms``; star topology only).

Clean-up is the point of this module: every namespace, and with it every veth and qdisc, and every
process started here is removed when the ``with`` block ends, on an exception, on Ctrl-C, on SIGTERM
(turned into ``SystemExit``) and at interpreter exit (``atexit``). Names carry a unique prefix with the
owner's pid (``trainsim-<pid>-<token>-...``) so ``cleanup_stale()`` can remove what a killed run left.
``netns_unavailable()`` says, in one line, why namespaces cannot be made here (no root, no ``ip``...).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any

from trainsim.errors import UserError

NS_PREFIX = "trainsim-"
"""Every namespace made here is named ``trainsim-<pid>-<token>-<role>``."""
SUBNET = "10.213"
"""First two octets of the private addresses used inside the namespaces."""
ETH_MTU = 1500
"""MTU of the links (bytes) unless the user-space delay line is in use."""
DELAY_LINE_MTU = 9000
"""MTU with the delay line: jumbo frames keep it at ~1.4k packets/s per 100 Mbit/s (bytes)."""
GSO_DEFAULT = 65536
"""the kernel's ``gso_max_size`` of a veth (bytes)"""

_LIVE: set[Netns] = set()
_LOCK = threading.Lock()


def _sh(argv: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a setup command; on failure raise ``RuntimeError`` with its stderr."""
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


# --------------------------------------------------------------------------- capability checks
def netns_unavailable() -> str | None:
    """None when namespaces, veths and tbf can be made here, else a one-line reason."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' command (iproute2) is not installed"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run as root"
    probe = f"{NS_PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    try:
        res = _sh(["ip", "netns", "add", probe], check=False)
        if res.returncode != 0:
            return f"'ip netns add' failed: {res.stderr.strip() or res.returncode}"
        res = _sh(["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"], check=False)
        if res.returncode != 0:
            return f"cannot create veth links: {res.stderr.strip()}"
        res = _sh(["tc", "-n", probe, "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "10mbit",
                   "burst", "64kb", "limit", "1mb"], check=False)  # fmt: skip
        if res.returncode != 0:
            return f"cannot shape links with tc tbf: {res.stderr.strip()}"
    finally:
        _sh(["ip", "netns", "del", probe], check=False)
    return None


def has_netem() -> bool:
    """Whether the kernel offers the ``netem`` qdisc (otherwise delay uses the user-space delay line)."""
    probe = f"{NS_PREFIX}{os.getpid()}-netem{secrets.token_hex(2)}"
    try:
        if _sh(["ip", "netns", "add", probe], check=False).returncode != 0:
            return False
        _sh(["ip", "-n", probe, "link", "set", "lo", "up"], check=False)
        res = _sh(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
        return res.returncode == 0
    finally:
        _sh(["ip", "netns", "del", probe], check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces(prefix: str = NS_PREFIX) -> list[str]:
    """Names of the network namespaces whose name starts with ``prefix``."""
    if shutil.which("ip") is None:
        return []
    res = _sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.startswith(prefix)]


def cleanup_stale() -> list[str]:
    """Delete namespaces (and kill their processes) left by trainsim runs whose owner has died."""
    removed = []
    for name in list_namespaces():
        m = re.match(rf"{re.escape(NS_PREFIX)}(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace_pids(name)
            _sh(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed


def _kill_namespace_pids(ns: str) -> None:
    res = _sh(["ip", "netns", "pids", ns], check=False)
    for tok in res.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(tok), signal.SIGKILL)


# --------------------------------------------------------------------------- signal / exit safety net
def _cleanup_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for net in live:
        net.close()


atexit.register(_cleanup_all)
_PREV_HANDLERS: dict[int, Any] = {}


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Unwind through every ``with Netns(...)`` (their __exit__ cleans up), then exit like the signal.
    raise SystemExit(128 + signum)


def _install_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; atexit still cleans up
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if sig in _PREV_HANDLERS:
            continue
        prev = signal.getsignal(sig)
        if prev in (signal.SIG_DFL, None):
            _PREV_HANDLERS[sig] = prev
            signal.signal(sig, _on_signal)


def _restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    with _LOCK:
        if _LIVE:
            return
    for sig, prev in list(_PREV_HANDLERS.items()):
        signal.signal(sig, prev)
        del _PREV_HANDLERS[sig]


# --------------------------------------------------------------------------- the emulated network
class Netns:
    """N network namespaces joined through a hub by shaped veth links; a context manager.

    ``rate_mbit=None`` leaves links unshaped; ``delay_ms=0`` adds no latency. Use ``run``/``popen``
    to start commands in node ``i``; ``addr(i)`` is its address, ``ifname`` its interface name.
    """

    ifname = "eth0"

    def __init__(
        self,
        n: int,
        *,
        rate_mbit: float | None = None,
        delay_ms: float = 0.0,
        topology: str = "star",
        mtu: int | None = None,
    ) -> None:
        if not isinstance(n, int) or not 1 <= n <= 200:
            raise UserError(f"netns: n={n!r}; expected 1..200 namespaces")
        if topology not in ("star", "bridge"):
            raise UserError(f"netns: topology={topology!r}; expected 'star' or 'bridge'")
        _check_shape(rate_mbit, delay_ms)
        self.n = n
        self.topology = topology
        self._mtu_arg = mtu
        self.mtu = mtu or ETH_MTU
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        token = secrets.token_hex(3)
        self._short = f"ts{token}"  # interface names must stay under 16 characters
        self.prefix = f"{NS_PREFIX}{os.getpid()}-{token}"
        self.hub = f"{self.prefix}-hub"
        self.names = [f"{self.prefix}-n{i}" for i in range(n)]
        self._procs: list[subprocess.Popen[Any]] = []
        self._delay_proc: subprocess.Popen[Any] | None = None
        self._made: list[str] = []
        self._closed = False
        self._netem: bool | None = None

    # ------------------------------------------------------------------ public API
    def addr(self, i: int) -> str:
        """IPv4 address of node ``i`` (inside its namespace)."""
        return f"{SUBNET}.{i}.2" if self.topology == "star" else f"{SUBNET}.0.{i + 1}"

    def cmd(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run in node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def run(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in node ``i`` to completion (``subprocess.run`` keyword arguments)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.cmd(i, argv), **kwargs)

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in node ``i``; it is killed (with its process group) at clean-up."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.cmd(i, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def shape(self, *, rate_mbit: float | None, delay_ms: float = 0.0) -> None:
        """Change the shaping of every link in place (no need to rebuild the network)."""
        _check_shape(rate_mbit, delay_ms)
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        self._apply_shape()

    def __enter__(self) -> Netns:
        reason = netns_unavailable()
        if reason is not None:
            raise NetnsUnavailable(reason)
        with _LOCK:
            _LIVE.add(self)
        _install_signal_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process started here and delete every namespace (idempotent)."""
        if self._closed:
            return
        self._closed = True
        procs = [*self._procs, *([self._delay_proc] if self._delay_proc else [])]
        for p in procs:
            _kill_group(p)
        for ns in reversed(self._made):
            _kill_namespace_pids(ns)
            _sh(["ip", "netns", "del", ns], check=False)
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        with _LOCK:
            _LIVE.discard(self)
        _restore_signal_handlers()

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        hub = self.hub
        if self.delay_ms > 0 and self._mtu_arg is None:
            self._netem = has_netem()
            self.mtu = ETH_MTU if self._netem else DELAY_LINE_MTU
        self._add_ns(hub)
        _sh(["ip", "netns", "exec", hub, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        if self.topology == "bridge":
            _sh(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
            _sh(["ip", "-n", hub, "link", "set", "br0", "mtu", str(self.mtu), "up"])
        for i, ns in enumerate(self.names):
            self._add_ns(ns)
            # no slow-start restart after idle: DDP buckets are bursty, real clusters tune this off too
            _sh(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"])
            # each run's connections start from TCP's defaults, not from the ssthresh and window that the
            # kernel caches per peer when an earlier run's connections close (a run that follows another
            # on the same namespaces would otherwise inherit its congestion state)
            _sh(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_no_metrics_save=1"])
            hub_if, node_if = f"{self._short}h{i}", f"{self._short}n{i}"
            _sh(["ip", "-n", hub, "link", "add", hub_if, "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", node_if, "netns", ns])  # fmt: skip
            _sh(["ip", "-n", ns, "link", "set", node_if, "name", self.ifname])
            _sh(["ip", "-n", ns, "link", "set", self.ifname, "mtu", str(self.mtu), "up"])
            if self.topology == "star":
                _sh(["ip", "-n", hub, "addr", "add", f"{SUBNET}.{i}.1/24", "dev", hub_if])
                _sh(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", self.ifname])
                _sh(["ip", "-n", ns, "route", "add", "default", "via", f"{SUBNET}.{i}.1"])
            else:
                _sh(["ip", "-n", hub, "link", "set", hub_if, "master", "br0"])
                _sh(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", self.ifname])
            _sh(["ip", "-n", hub, "link", "set", hub_if, "up"])
        self._apply_shape()

    def _add_ns(self, ns: str) -> None:
        _sh(["ip", "netns", "add", ns])
        self._made.append(ns)
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _apply_shape(self) -> None:
        if self._netem is None:
            self._netem = self.delay_ms == 0 or has_netem()
        use_netem = self.delay_ms > 0 and self._netem
        if self.delay_ms > 0 and not use_netem and self.topology != "star":
            raise NetnsUnavailable("this kernel has no netem qdisc; added delay needs topology='star'")
        for i, ns in enumerate(self.names):
            hub_if = f"{self._short}h{i}"
            _sh(["tc", "-n", ns, "qdisc", "del", "dev", self.ifname, "root"], check=False)
            _sh(["tc", "-n", self.hub, "qdisc", "del", "dev", hub_if, "root"], check=False)
            # an ip or kernel without the setting keeps the default packets: a working, costlier link
            gso = str(gso_bytes(self.rate_mbit, self.mtu))
            _sh(["ip", "-n", ns, "link", "set", self.ifname, "gso_max_size", gso], check=False)
            _sh(["ip", "-n", self.hub, "link", "set", hub_if, "gso_max_size", gso], check=False)
            parent_node: list[str] = ["root"]
            if use_netem:
                _sh(["tc", "-n", ns, "qdisc", "add", "dev", self.ifname, "root", "handle", "1:", "netem",
                     "delay", f"{self.delay_ms}ms", "limit", "100000"])  # fmt: skip
                parent_node = ["parent", "1:"]
            if self.rate_mbit is not None:
                tbf = _tbf_args(self.rate_mbit, self.mtu)
                _sh(["tc", "-n", ns, "qdisc", "add", "dev", self.ifname, *parent_node, *tbf])
                _sh(["tc", "-n", self.hub, "qdisc", "add", "dev", hub_if, "root", *tbf])
        self._set_delay_line(0.0 if use_netem else self.delay_ms)

    def _set_delay_line(self, delay_ms: float) -> None:
        hub = self.hub
        if self._delay_proc is not None:
            _kill_group(self._delay_proc)
            self._delay_proc.wait(timeout=5)
            self._delay_proc = None
            for i in range(self.n):
                _sh(["ip", "-n", hub, "rule", "del", "iif", f"{self._short}h{i}", "lookup", "100"], check=False)
        if delay_ms <= 0:
            return
        tun = f"{self._short}d"
        if _sh(["ip", "-n", hub, "link", "show", tun], check=False).returncode != 0:
            _sh(["ip", "-n", hub, "tuntap", "add", "dev", tun, "mode", "tun"])
            _sh(["ip", "-n", hub, "link", "set", tun, "mtu", str(self.mtu), "up"])
            for key in ("all", "default", tun):
                _sh(["ip", "netns", "exec", hub, "sysctl", "-q", "-w", f"net.ipv4.conf.{key}.rp_filter=0"])
            _sh(["ip", "-n", hub, "route", "add", "default", "dev", tun, "table", "100"])
        self._delay_proc = subprocess.Popen(
            ["ip", "netns", "exec", hub, sys.executable, "-m", "trainsim.testbed.delayline", tun, str(delay_ms)],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.2)  # the delay line must hold the TUN device before traffic is routed into it
        if self._delay_proc.poll() is not None:
            err = self._delay_proc.stderr.read().decode() if self._delay_proc.stderr else ""
            raise RuntimeError(f"the delay line exited at start: {err.strip()}")
        for i in range(self.n):
            _sh(["ip", "-n", hub, "rule", "add", "iif", f"{self._short}h{i}", "lookup", "100", "pref", "100"])


@contextlib.contextmanager
def shaped_ranks(world: int, rate_mbit: float | None, delay_ms: float) -> Iterator[tuple[Any, str]]:
    """``(popen, master address)`` for ``world`` ranks in namespaces joined by links shaped to
    ``rate_mbit`` and ``delay_ms``, each rank's gloo on the namespace's interface with one intra-op
    thread (``trainsim.run.traced.traced_run``'s ``network``); ``UserError`` when namespaces cannot be made."""
    reason = netns_unavailable()
    if reason is not None:
        raise UserError(f"traced run: a shaped link needs network namespaces, and {reason}")
    with Netns(world, rate_mbit=rate_mbit, delay_ms=delay_ms) as net:

        def popen(rank: int, argv: list[str], **kw: Any) -> Any:
            env = dict(os.environ, GLOO_SOCKET_IFNAME=net.ifname, OMP_NUM_THREADS="1")
            return net.popen(rank, argv, env=env, **kw)

        yield popen, net.addr(0)


class NetnsUnavailable(RuntimeError):
    """Namespaces or shaping cannot be made here; the message says why, on one line."""


def _check_shape(rate_mbit: float | None, delay_ms: float) -> None:
    if rate_mbit is not None and not rate_mbit > 0:
        raise UserError(f"netns: rate_mbit={rate_mbit!r}; expected a bandwidth > 0 Mbit/s (or None: unshaped)")
    if not delay_ms >= 0:
        raise UserError(f"netns: delay_ms={delay_ms!r}; expected a one-way latency >= 0 ms")


GSO_HEADROOM = 128
"""bytes of headers a GSO packet carries beyond ``gso_max_size`` of payload, rounded up"""


def _burst_bytes(rate_mbit: float, mtu: int) -> int:
    """tbf's bucket: two max-size frames, or 200 us of tokens at high rates (small, so that a
    transfer's start is not a burst)."""
    return int(max(2 * (mtu + 14), rate_mbit * 1e6 / 8 * 200e-6))


def gso_bytes(rate_mbit: float | None, mtu: int) -> int:
    """``gso_max_size`` of the shaped interfaces: the largest packet TCP hands the link, two of which
    fit in tbf's bucket. A larger one (the kernel's default is 64 KiB) is cut into frames by tbf on the
    CPU, which held a 1 Gbit/s link at 730 Mbit/s with 5.5 ms of sender CPU per MB on this project's
    2-core VM (943 Mbit/s and 0.74 ms/MB with this size: ``benchmarks/cluster_link.py``); a real NIC
    does that segmentation in hardware. Unshaped, or where the bucket holds less than four frames
    (below ~250 Mbit/s): the kernel's default, since one frame per packet lowered a 100 Mbit/s link to
    84 Mbit/s (95 with the default)."""
    g = _burst_bytes(rate_mbit, mtu) // 2 - GSO_HEADROOM if rate_mbit is not None else 0
    return g if g >= 2 * mtu else GSO_DEFAULT


def _tbf_args(rate_mbit: float, mtu: int) -> list[str]:
    rate_bytes = rate_mbit * 1e6 / 8
    burst = _burst_bytes(rate_mbit, mtu)
    limit = int(max(8 * burst, rate_bytes * 0.5, 4 << 20))  # deep queue: shaping drops nothing, TCP sees no loss
    return ["tbf", "rate", f"{rate_mbit * 1000:.0f}kbit", "burst", str(burst), "limit", str(limit)]


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
