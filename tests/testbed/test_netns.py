"""The emulated network: connectivity, shaping, and that nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsim.errors import UserError
from trainsim.testbed import netns
from trainsim.testbed.netns import Netns, cleanup_stale, list_namespaces, netns_unavailable

needs_netns = pytest.mark.skipif(netns_unavailable() is not None, reason=f"no netns: {netns_unavailable()}")

SERVER = (
    "import socket,sys;s=socket.socket();s.bind((sys.argv[1],5001));s.listen(1);c,_=s.accept();n=0\n"
    "while True:\n d=c.recv(1<<20)\n if not d: break\n n+=len(d)\nc.sendall(str(n).encode())"
)
CLIENT = (
    "import socket,sys,time;c=socket.create_connection((sys.argv[1],5001));t=time.perf_counter()\n"
    "c.sendall(b'x'*int(sys.argv[2]));c.shutdown(socket.SHUT_WR);n=int(c.recv(64));print(n, time.perf_counter()-t)"
)


def test_missing_rights_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = netns_unavailable()
    assert reason is not None and "root" in reason and "\n" not in reason
    with pytest.raises(netns.NetnsUnavailable, match="root"), Netns(2):
        pass


def test_bad_arguments() -> None:
    with pytest.raises(UserError):
        Netns(0)
    with pytest.raises(UserError, match="rate_mbit"):
        Netns(2, rate_mbit=0)
    with pytest.raises(UserError, match="delay_ms"):
        Netns(2, delay_ms=-1)


@given(rate=st.floats(1.0, 100_000.0), mtu=st.sampled_from([netns.ETH_MTU, netns.DELAY_LINE_MTU]))
def test_gso_packets_fit_the_shapers_bucket(rate: float, mtu: int) -> None:
    g = netns.gso_bytes(rate, mtu)
    if g != netns.GSO_DEFAULT:  # tbf must never have to cut a packet into frames
        assert 2 * (g + netns.GSO_HEADROOM) <= netns._burst_bytes(rate, mtu)
        assert g >= 2 * mtu
    else:  # only where the bucket is too small for two packets of two frames each
        assert netns._burst_bytes(rate, mtu) // 2 - netns.GSO_HEADROOM < 2 * mtu
    assert netns.gso_bytes(None, mtu) == netns.GSO_DEFAULT


@pytest.mark.netns
@needs_netns
def test_fast_link_carries_its_rate() -> None:
    # with 64 KiB packets tbf cut every one into frames on the CPU, and this VM's 1 Gbit/s link carried
    # 0.73-0.82 Gbit/s; with packets that fit its bucket, 0.94-0.96 (benchmarks/cluster_link.py)
    with Netns(2, rate_mbit=1000) as net:
        shown = subprocess.run(["ip", "-n", net.names[0], "-d", "link", "show", net.ifname],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert f"gso_max_size {netns.gso_bytes(1000, net.mtu)} " in shown
        net.popen(1, [sys.executable, "-c", SERVER, net.addr(1)])
        time.sleep(0.5)
        size = 60_000_000
        out = net.run(0, [sys.executable, "-c", CLIENT, net.addr(1), str(size)], timeout=60)
        n, secs = out.stdout.split()
        assert int(n) == size
        assert 0.85e9 < size * 8 / float(secs) < 1.0e9


@pytest.mark.netns
@needs_netns
def test_shaped_transfer_and_cleanup() -> None:
    with Netns(2, rate_mbit=50, delay_ms=5) as net:
        prefix = net.prefix
        assert len([n for n in list_namespaces() if n.startswith(prefix)]) == 3
        net.popen(1, [sys.executable, "-c", SERVER, net.addr(1)])
        time.sleep(0.5)
        out = net.run(0, [sys.executable, "-c", CLIENT, net.addr(1), str(1_000_000)], timeout=30)
        n, secs = out.stdout.split()
        assert int(n) == 1_000_000
        # 1 MB at 50 Mbit/s is 0.16 s on the wire (+ RTT and headers); never faster than the shaping
        assert 0.16 < float(secs) < 1.5
    assert not [n for n in list_namespaces() if n.startswith(prefix)]


@pytest.mark.netns
@needs_netns
def test_cleanup_on_exception() -> None:
    with pytest.raises(KeyboardInterrupt), Netns(2, rate_mbit=10) as net:
        prefix = net.prefix
        proc = net.popen(0, [sys.executable, "-c", "import time; time.sleep(60)"])
        raise KeyboardInterrupt
    assert not [n for n in list_namespaces() if n.startswith(prefix)]
    assert proc.poll() is not None


@pytest.mark.netns
@needs_netns
def test_cleanup_on_sigterm_and_stale() -> None:
    code = (
        "import sys,time\nfrom trainsim.testbed.netns import Netns\n"
        "with Netns(2, rate_mbit=10, delay_ms=2) as net:\n"
        "    net.popen(0, [sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "    print(net.prefix, flush=True)\n    time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    prefix = p.stdout.readline().strip()
    assert [n for n in list_namespaces() if n.startswith(prefix)]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert not [n for n in list_namespaces() if n.startswith(prefix)]
    # SIGKILL leaves namespaces behind; cleanup_stale removes those of dead owners
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    prefix = p.stdout.readline().strip()
    p.kill()
    p.wait()
    assert [n for n in list_namespaces() if n.startswith(prefix)]
    removed = cleanup_stale()
    assert all(n.startswith(netns.NS_PREFIX) for n in removed)
    assert not [n for n in list_namespaces() if n.startswith(prefix)]


@pytest.mark.netns
@needs_netns
def test_bridge_topology_and_reshape() -> None:
    with Netns(3, rate_mbit=200, topology="bridge") as net:
        assert net.addr(2) == "10.213.0.3"
        net.popen(2, [sys.executable, "-c", SERVER, net.addr(2)])
        time.sleep(0.5)
        net.shape(rate_mbit=20)
        out = net.run(0, [sys.executable, "-c", CLIENT, net.addr(2), str(500_000)], timeout=30)
        n, secs = out.stdout.split()
        assert int(n) == 500_000 and float(secs) > 0.2  # 0.5 MB at 20 Mbit/s: 0.2 s on the wire


@pytest.mark.multiproc
def test_launch_returns_each_ranks_stdout_with_torchruns_variables() -> None:
    from trainsim.testbed.launch import launch

    code = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['GLOO_SOCKET_IFNAME'])"
    assert [o.split() for o in launch(2, ["-c", code], net=None, timeout_s=60)] == [["0", "2", "lo"], ["1", "2", "lo"]]


@pytest.mark.multiproc
def test_launch_names_the_failed_rank_and_kills_the_others() -> None:
    import time

    from trainsim.run.ranks import RankFailed
    from trainsim.testbed.launch import launch

    code = "import os, sys, time; r = int(os.environ['RANK']); r or time.sleep(60); sys.exit(f'rank {r} broke on purpose')"
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 exited with code 1: rank 1 broke on purpose") as e:
        launch(2, ["-c", code], net=None, timeout_s=60)
    assert e.value.rank == 1 and time.monotonic() - t0 < 30
