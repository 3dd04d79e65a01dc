"""traced_run's handling of a rank that torch aborts, and where it runs the ranks (no real processes:
run_workers is replaced); the workers' allocator setting (in a subprocess)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import pytest

from trainsim.run import ranks, traced
from trainsim.run.ranks import RankFailed


def _fake(failures: list[RankFailed]) -> Any:
    def run_workers(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        if failures:
            raise failures.pop(0)
        return [{"step_ms": [10.0, 11.0], "trace": "rank0.json.gz"}, {"step_ms": [12.0, 12.0], "trace": "rank1.json.gz"}]

    return run_workers


def test_a_rank_killed_by_a_signal_is_run_again_once_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranks, "run_workers", _fake([RankFailed(1, "rank 1 exited with code -6: malloc()", -6)]))
    res = traced.traced_run(traced.TracedRunConfig(model="mlp", world=2), tmp_path / "t")
    assert res["retried"] == ["rank 1 exited with code -6: malloc()"] and res["step_ms"] == 12.0


@pytest.mark.parametrize("code", [1, None])
def test_a_rank_that_fails_by_itself_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    code: int | None) -> None:  # fmt: skip
    monkeypatch.setattr(ranks, "run_workers", _fake([RankFailed(0, "boom", code), RankFailed(0, "again", code)]))
    with pytest.raises(RankFailed, match="boom"):
        traced.traced_run(traced.TracedRunConfig(model="mlp", world=2), tmp_path / "t")


def test_two_aborts_in_a_row_end_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fails = [RankFailed(1, "first", -6), RankFailed(1, "second", -11)]
    monkeypatch.setattr(ranks, "run_workers", _fake(fails))
    with pytest.raises(RankFailed, match="second"):
        traced.traced_run(traced.TracedRunConfig(model="mlp", world=2), tmp_path / "t")


def test_a_shaped_link_runs_the_ranks_where_network_puts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from trainsim.errors import UserError

    seen: dict[str, Any] = {}

    def run_workers(*args: Any, popen: Any, master: str, **kw: Any) -> list[dict[str, Any]]:
        seen.update(popen=popen, master=master)
        return _fake([])()

    @contextlib.contextmanager
    def network(world: int, rate_mbit: float | None, delay_ms: float) -> Any:
        seen["link"] = (world, rate_mbit, delay_ms)
        yield "placed-popen", "10.0.0.2"

    monkeypatch.setattr(ranks, "run_workers", run_workers)
    cfg = traced.TracedRunConfig(model="mlp", world=2, rate_mbit=100, delay_ms=2.0)
    with pytest.raises(UserError, match="network="):  # the test bed's namespaces are not run's to make
        traced.traced_run(cfg, tmp_path / "a")
    traced.traced_run(cfg, tmp_path / "b", network=network)
    assert seen == {"link": (2, 100, 2.0), "popen": "placed-popen", "master": "10.0.0.2"}


@pytest.mark.parametrize(
    ("min_s", "step_s", "expected"),
    [
        (0.0, 0.001, 8),  # no minimum: the configured steps
        (1.0, 0.010, 100),  # 10 ms steps: 100 of them fill a second
        (1.0, 0.500, 8),  # long steps: the configured count is already more than a second
        (1.0, 1e-6, 400),  # at most 50x the configured steps
        (1.0, float("inf"), 8),  # no warm-up step timed
    ],
)
def test_short_steps_are_timed_for_at_least_min_timed_s(min_s: float, step_s: float, expected: int) -> None:
    cfg = traced.TracedRunConfig(model="mlp", world=1, steps=8, min_timed_s=min_s)
    assert traced.timed_steps(cfg, step_s) == expected


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_min_timed_s_is_named(bad: float) -> None:
    from trainsim.errors import UserError

    with pytest.raises(UserError, match="min_timed_s"):
        traced.TracedRunConfig(min_timed_s=bad)


_FAULTS = """
import resource, sys
import numpy as np
from trainsim.run.traced import keep_freed_memory
said = keep_freed_memory() if sys.argv[1] == "keep" else "default"
np.ones(10_000_000, dtype=np.float32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    a = np.ones(10_000_000, dtype=np.float32)  # 40 MB, above glibc's largest dynamic mmap threshold (32 MB)
    del a
print(said, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc (Linux)")
def test_a_worker_reuses_freed_memory_instead_of_faulting_it_in_every_step() -> None:
    """The default allocator maps each 40 MB block afresh and faults it in again (10,000 pages of 4 KiB, or
    20 huge pages, per block); after keep_freed_memory a freed block is the next one's memory: no faults."""
    said, kept = _minor_faults(_FAULTS, "keep")
    assert said == "glibc: mmap off, no trim" and kept < 10
    said, default = _minor_faults(_FAULTS, "default")
    assert said == "default" and default >= 10 * 20  # the cost the worker no longer pays in every step


_GROWTH = """
import resource, sys
from trainsim.run.traced import keep_freed_memory, prefault_heap
keep_freed_memory()
done = prefault_heap(64 << 20) if sys.argv[1] == "pad" else False
import ctypes, ctypes.util
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
kept = [libc.malloc(1 << 20) for _ in range(32)]  # the heap grows by 32 MiB
for p in kept:
    ctypes.memset(p, 2, 1 << 20)
print(done, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc (Linux)")
def test_a_prefaulted_heap_grows_without_page_faults() -> None:
    """32 MiB of new heap blocks fault in 8,192 pages of 4 KiB (16 huge pages); after prefault_heap(64 MiB)
    they are memory already faulted in: none."""
    done, padded = _minor_faults(_GROWTH, "pad")
    assert done == "True" and padded < 16
    done, plain = _minor_faults(_GROWTH, "plain")
    assert done == "False" and plain >= 16


def _minor_faults(script: str, mode: str) -> tuple[str, int]:
    """Run ``script`` (which prints what it did, then its page-fault count) in a fresh interpreter."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
    said, n = out.stdout.rsplit(maxsplit=1)
    return said, int(n)
