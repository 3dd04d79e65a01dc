"""Kill a rank of a real gloo DDP job and restart it from its last checkpoint; measure what that lost.

    >>> from trainsim.run.elastic import ElasticConfig, supervise, lost_time
    >>> cfg = ElasticConfig(steps=60, checkpoint_every=20, kill_rank=1, kill_step=35,
    ...                     checkpoint_dir="ckpt")                                # doctest: +SKIP
    >>> res = supervise(cfg)                                                      # doctest: +SKIP
    >>> lost_time(res, cfg).lost_s                                                # doctest: +SKIP

The supervisor (``supervise``), around ``ranks.local_popen``:

1. Host the job's TCP store (a fresh port per attempt) and start one ``trainsim.run.elastic_worker``
   per rank; each restores the newest checkpoint of ``checkpoint_dir`` (if any) and trains to
   ``steps`` (the worker's docstring).
2. Poll the ranks every ``poll_s``. The first to exit non-zero is the failed rank; the others get
   ``grace_s`` to fail by themselves (their collective ends with ``PeerLost`` within the collective
   timeout), then whatever is left is SIGKILLed by process group. Each attempt is an ``Attempt``.
3. Restart (step 1) until the job finishes or ``max_restarts`` restarts are spent; then ``RankFailed``
   names the dead rank, how it died, and what each survivor said.

Checkpoints (``save_checkpoint``) hold the model, the optimizer, torch's RNG and the next step; they are
written to a temporary file in the same folder, fsynced and renamed over ``checkpoint.pt`` (a rename is
atomic on POSIX), so a rank killed mid-write leaves the previous checkpoint whole.

The lost time of one failure (``lost_time``) is measured from the kill to the moment the restarted job
starts the step it was killed in: detection, tear-down, restart (process start, ``import torch``,
process group, model, DDP), restore and the recomputed steps. ``predict_lost_s`` is the same quantity
from ``plan.goodput``'s model of one failure (its item 3): the work since the last completed checkpoint
plus ``restart_s + restore_s``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trainsim.errors import UserError
from trainsim.run.ranks import Popen, RankFailed, local_popen, python, stderr_tail, stop_all

if TYPE_CHECKING:
    from trainsim.plan.goodput import GoodputConfig

KILL_SIGNALS = ("SIGKILL", "SIGSTOP")
"""the failures a rank can inject into itself (``ElasticConfig.kill_signal``)"""
CHECKPOINT = "checkpoint.pt"
"""the newest checkpoint's name in ``checkpoint_dir``; temporary files start with ``.tmp-``"""

EXIT_PEER_LOST = 3
"""exit code of a rank whose collective failed because a peer is gone"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticConfig:
    """One supervised job and the failure injected into it."""

    checkpoint_dir: str
    """folder of the job's checkpoint; one there at the start is resumed from"""
    model: str = "mlp"
    """zoo model: mlp, cnn or transformer"""
    width: int = 1024
    """hidden width of the MLP"""
    depth: int = 4
    """linear layers of the MLP"""
    batch_size: int = 32
    """samples per step and rank"""
    optimizer: str = "sgd"
    """an optimizer name of ``trainsim.capture.profile.OPTIMIZERS``"""
    world: int = 2
    """ranks (processes, gloo over loopback)"""
    steps: int = 60
    """steps of the whole job"""
    checkpoint_every: int = 20
    """rank 0 writes a checkpoint after every this many steps"""
    kill_rank: int | None = None
    """rank that SIGKILLs itself on the first attempt (None: no failure)"""
    kill_step: int | None = None
    """the step at whose start it does (it has completed ``kill_step`` steps)"""
    kill_signal: str = "SIGKILL"
    """SIGKILL (a crash: the rank's sockets close) or SIGSTOP (a hang: they stay open and silent)"""
    max_restarts: int = 1
    """restarts before the supervisor gives up with ``RankFailed``"""
    collective_timeout_s: float = 10.0
    """timeout of every collective (``init_gloo``): a survivor never waits longer for a dead peer"""
    grace_s: float = 12.0
    """after a rank dies, how long the others get to fail by themselves before they are killed"""
    poll_s: float = 0.01
    """the supervisor's polling period: the mean detection delay is half of it"""
    timeout_s: float = 300.0
    """wall-clock limit of one attempt"""
    seed: int = 0
    pin: bool = False
    """keep each rank on a core of its own (``ranks.pin_to_core``)"""

    def __post_init__(self) -> None:
        from trainsim.capture.profile import OPTIMIZERS

        for f in ("width", "depth", "batch_size", "world", "steps", "checkpoint_every"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"elastic run: {f}={v!r}; expected a positive integer")
        if self.world < 2:
            raise UserError(f"elastic run: world={self.world}; expected at least 2 ranks (a failure needs a peer)")
        if self.max_restarts < 0:
            raise UserError(f"elastic run: max_restarts={self.max_restarts}; expected >= 0")
        for f in ("collective_timeout_s", "poll_s", "timeout_s"):
            if not getattr(self, f) > 0:
                raise UserError(f"elastic run: {f}={getattr(self, f)!r}; expected a positive number of seconds")
        if self.grace_s < 0:
            raise UserError(f"elastic run: grace_s={self.grace_s!r}; expected >= 0 seconds")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"elastic run: optimizer {self.optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
        if (self.kill_rank is None) != (self.kill_step is None):
            raise UserError(f"elastic run: kill_rank={self.kill_rank!r}, kill_step={self.kill_step!r}; "
                            "expected both (a failure) or neither")  # fmt: skip
        if self.kill_signal not in KILL_SIGNALS:
            raise UserError(f"elastic run: kill_signal={self.kill_signal!r}; expected one of {', '.join(KILL_SIGNALS)}")
        if self.kill_rank is not None and not 0 <= self.kill_rank < self.world:
            raise UserError(f"elastic run: kill_rank={self.kill_rank}; expected a rank in 0..{self.world - 1}")
        if self.kill_step is not None and not 0 <= self.kill_step < self.steps:
            raise UserError(f"elastic run: kill_step={self.kill_step}; expected a step in 0..{self.steps - 1}")


# --------------------------------------------------------------------------- checkpoints
def checkpoint_state(model: Any, opt: Any, next_step: int) -> dict[str, Any]:
    """What a checkpoint holds: the model's and optimizer's state, torch's RNG, the next step to run."""
    import torch

    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": next_step}


def save_checkpoint(folder: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` as ``folder/checkpoint.pt`` atomically: a temporary file in the same folder,
    fsynced, renamed over the old one, and the folder fsynced (so the rename survives a host crash)."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / CHECKPOINT)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return folder / CHECKPOINT


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint to restart from, or None; temporary files of a write that never finished are
    ignored (a rank killed mid-write leaves one)."""
    path = Path(folder) / CHECKPOINT
    return path if path.is_file() else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    missing = {"model", "optimizer", "rng", "step"} - set(state)
    if missing:
        raise UserError(f"{path}: not a trainsim checkpoint (missing {', '.join(sorted(missing))})")
    return state


def restore_state(model: Any, opt: Any, state: dict[str, Any]) -> int:
    """Load ``state`` into ``model`` and ``opt`` (in place) and torch's RNG; the next step to run."""
    import torch

    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


# --------------------------------------------------------------------------- the supervisor
@dataclass(frozen=True, slots=True)
class Attempt:
    """One start of the job, as the supervisor saw it (times: ``time.monotonic``, s)."""

    index: int
    launched_t: float
    """just before the first rank's process was started"""
    ended_t: float
    """every rank of the attempt gone (exited, or killed and reaped)"""
    codes: tuple[int | None, ...]
    """exit codes by rank (negative: the signal; the ranks in ``killed`` show the supervisor's SIGKILL)"""
    failed_rank: int | None
    """the first rank seen to exit non-zero; None: the attempt finished"""
    detected_t: float | None
    """when the supervisor saw that rank's exit"""
    survivors_exit_s: dict[int, float] = field(default_factory=dict)
    """seconds from the detection until each other rank exited by itself"""
    killed: tuple[int, ...] = ()
    """ranks still alive after ``grace_s``, killed by the supervisor"""
    stderr: dict[int, str] = field(default_factory=dict)
    """the tail of each failed or killed rank's stderr"""
    pids: tuple[int, ...] = ()
    events: tuple[tuple[dict[str, Any], ...], ...] = ()
    """each rank's events (``elastic_worker``'s module docstring)"""

    def describe(self) -> str:
        if self.failed_rank is None:
            return f"attempt {self.index}: finished"
        code = self.codes[self.failed_rank]
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with code {code}"
        said = f": {self.stderr.get(self.failed_rank, '(no stderr)')}" if code is not None and code > 0 else ""
        parts = [f"attempt {self.index}: rank {self.failed_rank} {how}{said}"]
        for r, dt in sorted(self.survivors_exit_s.items()):
            parts.append(f"rank {r} failed by itself {dt:.3f} s later: {self.stderr.get(r, '(no stderr)')}")
        parts += [f"rank {r} still running after the grace period, killed" for r in self.killed]
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class ElasticResult:
    config: ElasticConfig
    attempts: tuple[Attempt, ...]
    wall_s: float
    """from the first launch until the last attempt's ranks were gone"""

    @property
    def digest(self) -> float | None:
        """rank 0's sum of the final weights (equal for a restarted and an unfailed run of one config)"""
        done = [e for e in self.attempts[-1].events[0] if e["ev"] == "done"] if self.attempts[-1].events else []
        return float(done[0]["digest"]) if done else None

    def to_json(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "wall_s": self.wall_s, "digest": self.digest,
                "attempts": [{**asdict(a), "events": None, "summary": a.describe()} for a in self.attempts]}  # fmt: skip


def supervise(cfg: ElasticConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1") -> ElasticResult:
    """Run ``cfg``'s job to the end, restarting it from its last checkpoint after a failure (module
    docstring); raise ``RankFailed`` naming the dead rank once ``max_restarts`` restarts are spent."""
    attempts: list[Attempt] = []
    with tempfile.TemporaryDirectory(prefix="trainsim-elastic-") as tmp:
        while True:
            a = _attempt(cfg, len(attempts), Path(tmp), popen, master)
            attempts.append(a)
            if a.failed_rank is None:
                return ElasticResult(cfg, tuple(attempts), a.ended_t - attempts[0].launched_t)
            if len(attempts) > cfg.max_restarts:
                raise RankFailed(a.failed_rank, f"gave up after {cfg.max_restarts} restart(s): " + a.describe())


def _attempt(cfg: ElasticConfig, index: int, tmp: Path, popen: Popen, master: str) -> Attempt:
    from torch.distributed import TCPStore

    # the job's rendezvous, hosted here (as torchrun's agent does) and listening before any rank starts
    store = TCPStore(master, 0, None, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=cfg.collective_timeout_s))  # fmt: skip
    port = store.port
    conf = json.dumps({**asdict(cfg), "attempt": index})
    evs = [tmp / f"a{index}-r{r}.jsonl" for r in range(cfg.world)]
    procs: list[subprocess.Popen[Any]] = []
    errs: list[IO[bytes]] = []
    launched = time.monotonic()
    try:
        for r in range(cfg.world):
            errs.append(tempfile.TemporaryFile())
            argv = [python(), "-m", "trainsim.run.elastic_worker", "--rank", str(r), "--master", master,
                    "--port", str(port), "--out", str(evs[r]), "--config", conf]  # fmt: skip
            procs.append(popen(r, argv, stdout=subprocess.DEVNULL, stderr=errs[r]))
        failed, detected, exit_s, killed = _watch(procs, cfg, launched)
        ended = time.monotonic()
        codes = tuple(p.poll() for p in procs)
        tails = {r: stderr_tail(errs[r], 4) for r in range(cfg.world) if codes[r] not in (0,)}
        return Attempt(index=index, launched_t=launched, ended_t=ended, codes=codes, failed_rank=failed,
                       detected_t=detected, survivors_exit_s=exit_s, killed=killed, stderr=tails,
                       pids=tuple(p.pid for p in procs), events=tuple(read_events(e) for e in evs))  # fmt: skip
    finally:
        stop_all(procs)
        for e in errs:
            e.close()
        del store


def _watch(
    procs: Sequence[subprocess.Popen[Any]], cfg: ElasticConfig, launched: float
) -> tuple[int | None, float | None, dict[int, float], tuple[int, ...]]:
    """Poll until every rank exited 0, or one failed and the others exited or outlived the grace
    period; ``(failed rank, detection time, survivors' exit delays, ranks killed)``."""
    deadline = launched + cfg.timeout_s
    failed: int | None = None
    detected: float | None = None
    exit_s: dict[int, float] = {}
    while True:
        now = time.monotonic()
        codes = [p.poll() for p in procs]
        if failed is None:
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:  # the first seen; several in one poll: the one that did not merely lose a peer
                failed = min(bad, key=lambda r: (codes[r] == EXIT_PEER_LOST, r))
                detected = now
            elif all(c == 0 for c in codes):
                return None, None, {}, ()
            elif now > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                stop_all(procs)
                raise RankFailed(running[0] if running else None,
                                 f"attempt timed out after {cfg.timeout_s:g} s; ranks still running: {running}")  # fmt: skip
        if failed is not None and detected is not None:
            for r, c in enumerate(codes):
                if r != failed and c is not None and r not in exit_s:
                    exit_s[r] = now - detected
            alive = tuple(r for r, c in enumerate(codes) if c is None)
            if not alive:
                return failed, detected, exit_s, ()
            if now - detected >= cfg.grace_s:
                stop_all(procs)
                return failed, detected, exit_s, alive
        time.sleep(cfg.poll_s)


def read_events(path: str | Path) -> tuple[dict[str, Any], ...]:
    """A rank's event lines; a last line cut by a kill is dropped."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return ()
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return tuple(out)


# --------------------------------------------------------------------------- lost time: measured and predicted
@dataclass(frozen=True, kw_only=True, slots=True)
class LostTime:
    """One failure's cost, seconds, measured on the run (``lost_time``); the parts add up to ``lost_s``."""

    kill_step: int
    restart_step: int
    """the step the restarted job began at (the last checkpoint's)"""
    detect_s: float
    """kill -> the supervisor sees the rank gone"""
    teardown_s: float
    """-> the survivors gone (by themselves or killed) and the next attempt launched"""
    restart_s: float
    """-> every rank ready (processes started, torch imported, process group, model, DDP)"""
    restore_s: float
    """-> every rank has loaded the checkpoint"""
    recompute_s: float
    """-> the slowest rank starts ``kill_step`` again"""
    lost_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lost_time(res: ElasticResult, cfg: ElasticConfig | None = None) -> LostTime:
    """The lost time of the first failure of ``res`` (module docstring), from the attempts' events."""
    cfg = cfg or res.config
    if len(res.attempts) < 2 or cfg.kill_step is None or cfg.kill_rank is None:
        raise ValueError("lost_time needs a run with an injected failure and a restart")
    first, second = res.attempts[0], res.attempts[1]
    kills = [e for e in first.events[cfg.kill_rank] if e["ev"] == "kill"]
    if not kills or first.detected_t is None:
        raise ValueError(f"attempt 0: rank {cfg.kill_rank} has no kill event; {first.describe()}")
    t_kill = kills[0]["t"]

    def last(ev: str, **match: Any) -> float:
        ts = [e["t"] for evs in second.events for e in evs if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]
        if len(ts) != cfg.world:
            raise ValueError(f"attempt 1: {len(ts)} of {cfg.world} ranks logged {ev} {match or ''}")
        return max(ts)

    ready, restored, caught_up = last("ready"), last("restored"), last("step", i=cfg.kill_step)
    start = next(e["step"] for e in second.events[0] if e["ev"] == "restored")
    return LostTime(kill_step=cfg.kill_step, restart_step=int(start), detect_s=first.detected_t - t_kill,
                    teardown_s=second.launched_t - first.detected_t, restart_s=ready - second.launched_t,
                    restore_s=restored - ready, recompute_s=caught_up - restored, lost_s=caught_up - t_kill)  # fmt: skip


def step_times_s(attempt: Attempt, skip: int = 0) -> list[float]:
    """Per step of ``attempt`` (after its first ``skip``), the time from the slowest rank's start of
    the step to its start of the next, seconds; steps that wrote a checkpoint are left out."""
    starts: dict[int, float] = {}
    for evs in attempt.events:
        for e in evs:
            if e["ev"] == "step":
                starts[e["i"]] = max(starts.get(e["i"], -1e300), e["t"])
    ckpt = {e["i"] for evs in attempt.events for e in evs if e["ev"] == "ckpt"}
    idx = sorted(starts)[skip:]
    return [starts[b] - starts[a] for a, b in itertools.pairwise(idx) if b == a + 1 and b not in ckpt]


def restart_checkpoint_step(kill_step: int, every: int) -> int:
    """The step a job killed at the start of ``kill_step`` restarts from: the last multiple of
    ``every`` that is at most ``kill_step`` (a checkpoint is written after steps every-1, 2 every-1...)."""
    if kill_step < 0 or every < 1:
        raise ValueError(f"kill_step={kill_step}, every={every}; expected kill_step >= 0 and every >= 1")
    return kill_step // every * every


def predict_lost_s(gcfg: GoodputConfig, kill_step: int, every: int, detect_s: float = 0.0) -> float:
    """``plan.goodput``'s model of one failure (its item 3) for a kill at the start of ``kill_step``:
    the work since the last completed checkpoint, ``(kill_step - checkpoint step) * step_s``, plus
    ``restart_s + restore_s`` and, with no spares, ``repair_s``; ``detect_s`` is added to restart_s
    where the caller measured the start-up alone."""
    lost_work_s = (kill_step - restart_checkpoint_step(kill_step, every)) * gcfg.step_s
    down_s = gcfg.restart_s + gcfg.restore_s + (gcfg.repair_s if gcfg.spare_nodes == 0 else gcfg.replace_s)
    return lost_work_s + down_s + detect_s
