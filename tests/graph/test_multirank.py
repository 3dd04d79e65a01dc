"""Multi-rank jobs: merged graph, clock alignment, barriers, the straggler what-if, and bad input.

The hand-made job (``_job``): two ranks, three steps. Per step each rank computes (``aten::mm``, rank
0 for ``COMPUTE_US[0]``, rank 1, the straggler, for ``COMPUTE_US[1]``), enqueues the all-reduce
(``c10d::allreduce_``, 100 us), then its gloo thread runs ``gloo:all_reduce`` from 50 us later (its
arrival) until ``TRANSFER_US`` after the last rank's arrival, and the main thread resumes 50 us after
that and ends the step. Rank 1's clock reads ``CLOCK_US`` more than rank 0's; its collective ends are
jittered by a few microseconds, as real ones are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.tracefactory import PID, TraceMaker
from trainsim.cli.main import main
from trainsim.graph.ir import TaskKind
from trainsim.graph.multirank import barriers, job_summary, load_job, task_ranks
from trainsim.simulate.engine import simulate
from trainsim.transform.straggler import remove_straggler, straggler_rank

COMPUTE_US = (10_000.0, 14_000.0)
TRANSFER_US = 3_000.0
CLOCK_US = 5_000.0
GLOO_TID = 200
JITTER_US = ((0.0, 0.0, 0.0), (8.0, -8.0, 0.0))  # per rank and step, added to the traced collective end


def _job(folder: Path, *, compute: tuple[float, ...] = COMPUTE_US, clock: tuple[float, ...] = (0.0, CLOCK_US),
         jitter: tuple[tuple[float, ...], ...] = JITTER_US, world: int | None = None, nelems: int = 1000,
         ranks: tuple[int, ...] | None = None, collectives: bool = True) -> list[Path]:  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    n = len(compute)
    makers = [TraceMaker() for _ in range(n)]
    s = 1000.0  # true time of the first step's start
    for step in range(3):
        arrive = [s + c + 150 for c in compute]
        end = max(arrive) + TRANSFER_US
        for r, t in enumerate(makers):
            o = clock[r]
            t.step(step, s + o, end + 50 - s)
            t.cpu("aten::mm", s + o, compute[r])
            t.cpu("c10d::allreduce_", s + compute[r] + o, 100)
            if collectives:
                t.cpu("gloo:all_reduce", arrive[r] + o, end + jitter[r][step] - arrive[r], tid=GLOO_TID,
                      cat="user_annotation", **{"Input Dims": [[nelems]], "Input type": ["float"]})  # fmt: skip
        s = end + 100
    paths = []
    for r, t in enumerate(makers):
        rank = r if ranks is None else ranks[r]
        doc = {"schemaVersion": 1, "host_name": f"host{rank}", "traceEvents": t.events,
               "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world or n}}  # fmt: skip
        p = folder / f"rank{rank}.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths


def test_merged_replay_alignment_and_straggler(tmp_path: Path) -> None:
    job = load_job([tmp_path / "x"] if _job(tmp_path / "x") else [])
    g = job.graph
    # every task knows its rank; each rank's threads are prefixed; one barrier per step's collective
    assert {r.name for r in g.resources} >= {f"r0/cpu:{PID}/{GLOO_TID}", f"r1/cpu:{PID}/{GLOO_TID}"}
    assert set(task_ranks(g).tolist()) == {-1, 0, 1}
    bar, arr, xfer = barriers(g)
    assert job.collectives == 3 and bar.size == 6 and (xfer >= 0).all()
    assert (g.kind[arr] == TaskKind.SYNC).all() and (g.dur_us[arr] == 0).all()
    # the clock offset is the median of the end differences: the jitter (+8, -8, 0) has median 0
    assert job.ranks[1].offset_us == pytest.approx(CLOCK_US, abs=1e-6)
    # transfer = end - last arrival (rank 1's end is jittered)
    assert sorted(np.round(g.dur_us[xfer], 3).tolist()) == sorted(
        [TRANSFER_US] * 4 + [TRANSFER_US + 8, TRANSFER_US - 8]
    )
    # replay: every step is the straggler's compute + enqueue + transfer + resume
    expect_ms = (COMPUTE_US[1] + 150 + TRANSFER_US + 50) / 1e3  # 17.2 ms
    out = job_summary(job, simulate(g))
    assert out["measured_ms"] == pytest.approx(expect_ms)
    assert [s["simulated_ms"] for s in out["steps"]] == pytest.approx([expect_ms] * 3, abs=0.02)
    assert [s["slowest_rank"] for s in out["steps"]] == [1, 1, 1]
    slow = out["steps"][1]["slowest"]
    assert slow["compute_ms"] == pytest.approx((COMPUTE_US[1] + 150) / 1e3, abs=0.02)
    assert slow["waiting_ms"] == pytest.approx(0.0, abs=0.02)
    rank0 = out["per_rank"][0]
    assert rank0["waiting_ms"] == pytest.approx((COMPUTE_US[1] - COMPUTE_US[0]) / 1e3, abs=0.1)
    # without the straggler, rank 1 computes what rank 0 does: the step is rank 0's alone
    assert straggler_rank(g) == 1
    no_slow = job_summary(job, simulate(remove_straggler(g)))
    assert no_slow["simulated_ms"] == pytest.approx((COMPUTE_US[0] + 150 + TRANSFER_US + 50) / 1e3, abs=0.02)
    # naming the fast rank changes nothing (never scaled up)
    same = job_summary(job, simulate(remove_straggler(g, rank=0)))
    assert same["simulated_ms"] == pytest.approx(expect_ms, abs=0.02)


def test_single_rank_replays_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _job(tmp_path, compute=(COMPUTE_US[0],), clock=(0.0,), jitter=((0.0, 0.0, 0.0),))[0]
    assert main(["replay", str(p), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trace"] == str(p) and "per_rank" not in doc


def test_cli_job_json_and_no_straggler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _job(tmp_path)
    (tmp_path / "rank0.trainsim.json").write_text(json.dumps({"model": "mlp", "rank": 0, "world": 2}))
    assert main(["replay", str(tmp_path), "--json", "--no-straggler"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"] == [0, 1] and [r["rank"] for r in doc["per_rank"]] == [0, 1]
    assert doc["per_rank"][1]["clock_offset_us"] == pytest.approx(CLOCK_US)
    assert doc["no_straggler"]["rank"] == 1
    assert doc["no_straggler"]["simulated_ms"] == pytest.approx(13.2, abs=0.02)
    assert main(["replay", str(tmp_path), "--no-straggler"]) == 0
    text = capsys.readouterr().out
    assert "step 1: slowest rank 1: 14.2 ms compute" in text and "without the straggler (rank 1" in text


def _err(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_different_jobs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _job(tmp_path / "a")
    b = _job(tmp_path / "b", world=3, compute=(1.0, 2.0, 3.0), clock=(0, 0, 0), jitter=((0,) * 3,) * 3)
    err = _err(["replay", str(a[0]), str(b[1])], capsys)
    assert "a/rank0.json" in err and "b/rank1.json" in err and "one job" in err
    err = _err(["replay", str(a[0]), str(b[0])], capsys)  # two rank-0 traces
    assert "both are rank 0" in err
    c = _job(tmp_path / "c", nelems=2000)  # the same steps, another gradient size
    err = _err(["replay", str(a[0]), str(c[1])], capsys)
    assert "a/rank0.json" in err and "c/rank1.json" in err and "4000 bytes" in err and "8000 bytes" in err
    d = _job(tmp_path / "d", collectives=False)
    err = _err(["replay", str(a[0]), str(d[1])], capsys)
    assert "no collectives in common" in err and "d/rank1.json has none" in err


def test_missing_rank_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _job(tmp_path, world=3)
    assert main(["replay", str(tmp_path), "--json"]) == 0
    cap = capsys.readouterr()
    assert "warning" in cap.err and "rank 2" in cap.err and "job of 3 ranks" in cap.err
    doc = json.loads(cap.out)
    assert doc["missing_ranks"] == [2] and doc["ranks"] == [0, 1]


def test_unalignable_clocks_name_the_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _job(tmp_path, jitter=((0.0, 0.0, 0.0), (0.0, 20_000.0, 40_000.0)))  # a clock that drifts
    err = _err(["replay", str(tmp_path)], capsys)
    assert "ranks 0 and 1" in err and "cannot be aligned" in err


@pytest.mark.slow
@pytest.mark.multiproc
def test_real_two_rank_gloo_job(tmp_path: Path) -> None:
    """A real 2-rank DDP run on loopback, profiled on both ranks, replayed as one job.

    Tolerance 2%: the replay keeps every traced duration and only re-derives the waits at the
    all-reduce from the aligned clocks, so the simulated step can miss the measured one only by the
    alignment residual (tens of µs on loopback, against ~25 ms steps: ~0.4%) where a rank's wait
    decides its step.
    """
    from trainsim.run.traced import TracedRunConfig, traced_run

    run = traced_run(TracedRunConfig(model="mlp", world=2), tmp_path / "run")
    job = load_job([tmp_path / "run"])
    assert [r.rank for r in job.ranks] == [0, 1] and job.collectives >= 3
    assert abs(job.ranks[1].offset_us) < 1000  # one host, one clock
    out = job_summary(job, simulate(job.graph))
    assert out["simulated_ms"] == pytest.approx(out["measured_ms"], rel=0.02)
    for s in out["steps"]:
        assert s["simulated_ms"] == pytest.approx(s["measured_ms"], rel=0.02)
    # the two ranks run the same model: which one lags changes from step to step, so the straggler is
    # the rank that waited least over the run; removing it never ends the job later (the FIFO replay is
    # a longest path: shorter tasks end nothing later; one step may still lengthen as its start moves up)
    assert straggler_rank(job.graph) in (0, 1)
    assert {s["slowest_rank"] for s in out["steps"]} <= {0, 1}
    _, _, end = simulate(remove_straggler(job.graph)).step_bounds_us()
    _, _, end0 = simulate(job.graph).step_bounds_us()
    assert end[-1] <= end0[-1] + 1e-3
    assert len(run["traces"]) == 2
