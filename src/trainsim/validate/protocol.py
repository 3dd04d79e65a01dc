"""The one protocol every ``trainsim validate`` command follows: predict, freeze, then measure.

    >>> from trainsim.validate.protocol import ResultFile
    >>> doc = ResultFile(path, command="trainsim validate whatif --seed 7", seed=7)   # doctest: +SKIP
    >>> doc.freeze([{"config": {...}, "predicted_ms": 41.2, "held_out": False}])       # doctest: +SKIP
    >>> interleave(doc, run_one, passes=3, log=print)                                   # doctest: +SKIP

1. The machine is calibrated once, with generic workloads (``trainsim.testbed.machine``); the file is
   named in the result.
2. The model is profiled, one process, as a user would.
3. ``ResultFile.freeze`` writes every prediction, with ``predictions_frozen_at``, before the first real
   run starts. From then on the predictions are read-only: ``record`` checks a digest of them on
   every write, so a prediction that changes after a measurement is a bug caught, not a number shown.
4. ``interleave`` runs the real configurations A B C A B C ... for ``passes`` passes and records each
   one's median, its spread (min-max relative to the median), a bootstrap 95 % interval of the
   median, and the error of the frozen prediction. In-run readings a runner returns go to the
   run's ``diagnostics`` field and nowhere else.

Ctrl-C (or any error) during the runs keeps what was measured: the file is rewritten with
``partial: true`` and the reason, and the exception goes on (the caller's ``finally`` cleans up).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import random
import statistics
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainsim.errors import UserError

WITHIN_PCT = 10.0
"""a prediction is good when within this many percent of the measured median"""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------- statistics
def spread_pct(samples: Sequence[float]) -> float:
    """(max - min) / median, in percent; 0 for fewer than two samples."""
    if len(samples) < 2:
        return 0.0
    return 100.0 * (max(samples) - min(samples)) / statistics.median(samples)


def bootstrap_ci(samples: Sequence[float], *, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap 95 % interval of the median of ``samples`` (resampled with replacement,
    ``n`` times, from a fixed seed so that the same samples give the same interval)."""
    if not samples:
        raise ValueError("bootstrap_ci of no samples")
    if len(samples) == 1:
        return (samples[0], samples[0])
    rng = random.Random(seed)
    k = len(samples)
    meds = sorted(statistics.median(rng.choices(samples, k=k)) for _ in range(n))
    return (meds[int(0.025 * (n - 1))], meds[int(0.975 * (n - 1))])


def within(error_pct: float, spread: float) -> str | bool:
    """``"10%"`` when the error is within ``WITHIN_PCT``, ``"spread"`` when it is not but lies within
    the configuration's own measured run-to-run spread (which is wider), else False."""
    if abs(error_pct) <= WITHIN_PCT:
        return "10%"
    if abs(error_pct) <= spread:
        return "spread"
    return False


def ranking(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether the predictions order the configurations as the runs do, wherever the measured gap
    between two of them is larger than both their spreads (elsewhere the order is noise)."""
    done = [r for r in runs if r.get("measured_ms") is not None]
    checked, wrong = 0, []
    for i, a in enumerate(done):
        for b in done[i + 1 :]:
            gap = 100.0 * abs(a["measured_ms"] - b["measured_ms"]) / min(a["measured_ms"], b["measured_ms"])
            if gap <= max(a.get("spread_pct", 0.0), b.get("spread_pct", 0.0)):
                continue
            checked += 1
            if (a["measured_ms"] < b["measured_ms"]) != (a["predicted_ms"] < b["predicted_ms"]):
                wrong.append([a.get("label", str(a["config"])), b.get("label", str(b["config"]))])
    return {"pairs_checked": checked, "misranked": wrong, "right": not wrong}


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures over the measured runs (drawn ones included)."""
    done = [r for r in runs if r.get("measured_ms") is not None]
    errs = [abs(r["error_pct"]) for r in done]
    held = [abs(r["error_pct"]) for r in done if r.get("held_out")]
    out: dict[str, Any] = {
        "measured": len(done),
        "mean_abs_error_pct": round(statistics.fmean(errs), 2) if errs else None,
        "max_abs_error_pct": round(max(errs), 2) if errs else None,
        "held_out_mean_abs_error_pct": round(statistics.fmean(held), 2) if held else None,
        "within_10pct": sum(r["within"] == "10%" for r in done),
        "within_spread": sum(r["within"] == "spread" for r in done),
        "outside": sum(r["within"] is False for r in done),
        "ranking": ranking(done),
    }
    return out


# --------------------------------------------------------------------------- the result file
def _digest(preds: Sequence[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(preds, sort_keys=True).encode()).hexdigest()


class ResultFile:
    """One validation's result document, written to ``path`` at every change (see the module docstring).

    ``runs`` rows hold ``config``, ``label``, ``held_out``, ``predicted_ms`` (and whatever else the
    prediction returns, frozen with it), then ``measured_ms``, ``measured_passes_ms``, ``spread_pct``,
    ``ci95_ms``, ``error_pct``, ``within`` and ``diagnostics`` as the runs come in."""

    __slots__ = ("_frozen", "_keys", "doc", "path")

    def __init__(
        self, path: Path, *, command: str, seed: int | None, calibration: dict[str, Any] | None = None,
        **meta: Any,
    ) -> None:  # fmt: skip
        self.path = path
        self.doc: dict[str, Any] = {
            "command": command, "seed": seed, "calibration": calibration, **meta, "started_at": now_iso(),
            "predictions_frozen_at": None, "runs_started_at": None, "partial": False, "runs": [],
        }  # fmt: skip
        self._frozen: str | None = None
        self._keys: list[list[str]] = []

    def freeze(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write every prediction, then make them read-only. Each row needs ``config``,
        ``predicted_ms`` (finite, > 0) and ``held_out``."""
        if self._frozen is not None:
            raise RuntimeError("the predictions are already frozen")
        for r in rows:
            for key in ("config", "predicted_ms", "held_out"):
                if key not in r:
                    raise ValueError(f"prediction row without {key!r}: {r}")
            if not r["predicted_ms"] > 0:
                raise ValueError(f"prediction {r['predicted_ms']!r} for {r['config']}; expected a time > 0 ms")
        self.doc["runs"] = [
            {**r, "measured_ms": None, "measured_passes_ms": [], "spread_pct": None, "ci95_ms": None,
             "error_pct": None, "within": None, "diagnostics": []}  # fmt: skip
            for r in rows
        ]
        self.doc["predictions_frozen_at"] = now_iso()
        self._keys = [sorted(r) for r in rows]
        self._frozen = _digest(self._predictions())
        write_json(self.path, self.doc)

    def _predictions(self) -> list[dict[str, Any]]:
        """Every row's fields as frozen (what the prediction wrote), for the digest."""
        return [{k: r.get(k) for k in keys} for r, keys in zip(self.doc["runs"], self._keys, strict=True)]

    def _check(self) -> None:
        if self._frozen is None:
            raise RuntimeError("measurements before the predictions were frozen")
        if _digest(self._predictions()) != self._frozen:
            raise AssertionError("a frozen prediction changed after it was written")

    def start_runs(self) -> None:
        self._check()
        self.doc["runs_started_at"] = now_iso()
        write_json(self.path, self.doc)

    def record(self, i: int, measured_ms: float, diagnostics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Add one pass's measured step of run ``i``; return the updated row."""
        self._check()
        if self.doc["runs_started_at"] is None:
            self.start_runs()
        row = self.doc["runs"][i]
        row["measured_passes_ms"].append(round(float(measured_ms), 3))
        xs = row["measured_passes_ms"]
        med = statistics.median(xs)
        row["measured_ms"] = round(med, 3)
        row["spread_pct"] = round(spread_pct(xs), 2)
        lo, hi = bootstrap_ci(xs)
        row["ci95_ms"] = [round(lo, 3), round(hi, 3)]
        row["error_pct"] = round(100.0 * (row["predicted_ms"] - med) / med, 2)
        row["within"] = within(row["error_pct"], row["spread_pct"])
        row["measured_at"] = now_iso()
        if diagnostics:
            row["diagnostics"].append(diagnostics)
        self.doc.update(summary(self.doc["runs"]))
        write_json(self.path, self.doc)
        return row

    def finish(self) -> dict[str, Any]:
        self._check()
        self.doc["finished_at"] = now_iso()
        self.doc.update(summary(self.doc["runs"]))
        write_json(self.path, self.doc)
        return self.doc

    def mark_partial(self, reason: str) -> None:
        """Keep what was measured, marked as partial, with why it stopped."""
        self.doc["partial"] = True
        self.doc["partial_reason"] = reason
        self.doc.update(summary(self.doc["runs"]))
        write_json(self.path, self.doc)


def open_result(out: Path, *, name: str, seed: int, passes: int, meta: dict[str, Any] | None) -> ResultFile:
    """The result file of ``validate <name>``: ``meta``'s ``command`` (default ``validate <name>``) and
    ``calibration`` (default none), its other fields beside them; ``passes`` < 1 is refused."""
    if passes < 1:
        raise UserError(f"validate {name}: passes={passes}; expected >= 1")
    meta = dict(meta or {})
    return ResultFile(out, command=meta.pop("command", f"validate {name}"), seed=seed,
                      calibration=meta.pop("calibration", None), **meta)  # fmt: skip


def config_row(config: Any, i: int, n_fixed: int, pred: dict[str, Any]) -> dict[str, Any]:
    """The row to freeze for configuration ``i`` (a dataclass with ``label()``) and its prediction
    ``pred``: the first ``n_fixed`` configurations are the fixed ones, the others drawn (``held_out``,
    starred in the label)."""
    held_out = i >= n_fixed
    return {"label": config.label() + ("*" if held_out else ""), "config": dataclasses.asdict(config),
            "held_out": held_out, **pred}  # fmt: skip


def protocol_options(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options every ``validate`` command of the protocol shares, with one wording: ``--passes``,
    ``--seed``, ``--calibration``, ``--recalibrate``, ``--out``, ``--force`` and ``--json`` (the
    command receives ``passes, seed, calibration, recalibrate, out, force, as_json``)."""
    import click

    opts = [
        click.option("--passes", type=int, default=3, show_default=True, help="runs per configuration, interleaved"),
        click.option("--seed", type=int, default=None,
                     help="seed of the drawn configurations (default: a fresh one, printed)"),
        click.option("--calibration", type=click.Path(dir_okay=False), default=None,
                     help="machine calibration file (default ~/.cache/trainsim/machine.json; measured when missing)"),
        click.option("--recalibrate", is_flag=True, help="measure the machine calibration again first"),
        click.option("--out", type=click.Path(dir_okay=False), default=None,
                     help=f"result file (predictions are written here before the runs); default out/{name}-<time>.json"),
        click.option("--force", is_flag=True, help="overwrite --out if it exists"),
        click.option("--json", "as_json", is_flag=True, help="print the result as one JSON object"),
    ]  # fmt: skip

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        for o in reversed(opts):
            f = o(f)
        return f

    return wrap


def open_run(name: str, *, seed: int, out: str | None, force: bool, calibration: str | None, recalibrate: bool,
             what: str) -> tuple[Path, Callable[[str], None], Any, Path, list[str]]:  # fmt: skip
    """The start every validation command shares: the result file (refused when it exists without
    ``force``), the progress log on stderr, the machine calibration (measured when missing), a note when
    network namespaces are unavailable, and the first progress line (the seed, ``what`` will run).
    Returns ``(path, log, calibration, its file, notes)``."""
    import time

    from rich.console import Console

    from trainsim.testbed.machine import load_machine
    from trainsim.testbed.netns import netns_unavailable
    from trainsim.validate import progress_log

    path = check_result_path(out, force, f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    log = progress_log(Console(stderr=True))
    mcal, cal_path = load_machine(Path(calibration) if calibration else None, recalibrate=recalibrate, log=log)
    notes: list[str] = []
    reason = netns_unavailable()
    if reason is not None:
        notes.append(f"network namespaces unavailable ({reason}); running on unshaped loopback")
    log(f"seed {seed} (repeat this draw with --seed {seed}); {what}; results -> {path}")
    for n in notes:
        log(f"note: {n}")
    return path, log, mcal, cal_path, notes


RunOne = Callable[[int, int], "float | tuple[float, dict[str, Any]]"]
"""``run_one(i, pass_index)`` runs configuration ``i`` for real and returns its measured step (ms), or
``(step_ms, diagnostics)``."""


def interleave(
    res: ResultFile, run_one: RunOne, *, passes: int, log: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Run every frozen configuration ``passes`` times, interleaved (A B C A B C ...), record each
    pass, and return the finished document. Any exception (KeyboardInterrupt included) marks the file
    partial and goes on."""
    if passes < 1:
        raise UserError(f"passes={passes}; expected >= 1")
    n = len(res.doc["runs"])
    res.start_runs()
    try:
        for p in range(passes):
            for i in range(n):
                row = res.doc["runs"][i]
                log(f"pass {p + 1}/{passes}, run {i + 1}/{n}: {row.get('label', row['config'])}")
                got = run_one(i, p)
                step, diag = got if isinstance(got, tuple) else (got, None)
                row = res.record(i, step, diag)
                log(f"  measured {step:.2f} ms (median {row['measured_ms']:.2f}); predicted "
                    f"{row['predicted_ms']:.2f} ms, error {row['error_pct']:+.1f} %")  # fmt: skip
    except BaseException as e:
        res.mark_partial("interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}")
        raise
    return res.finish()


ConfigRunner = Callable[[dict[str, Any], int], "float | tuple[float, dict[str, Any]]"]
"""``runner(config, pass_index)``: run one frozen configuration for real; its step (ms), or
``(step_ms, diagnostics)``."""


def link_label(rate: float | None, delay: float) -> str:
    """A run's link as its label shows it: ``240 Mbit/s +5 ms``, ``unshaped``."""
    return ("unshaped" if rate is None else f"{rate:g} Mbit/s") + (f" +{delay:g} ms" if delay else "")


def shaping(shaped: bool | None) -> tuple[bool, list[str]]:
    """``(whether links are shaped, notes)``: ``shaped`` when given, else whether network namespaces
    work here; when they do not, the note that says every case is predicted and run on loopback."""
    if shaped is not None:
        return shaped, []
    from trainsim.testbed.netns import netns_unavailable

    reason = netns_unavailable()
    if reason is None:
        return True, []
    return False, [f"network namespaces unavailable ({reason}): every case predicted and run on unshaped loopback"]


def freeze_and_run(
    res: ResultFile,
    rows: list[dict[str, Any]],
    *,
    runner: ConfigRunner | None,
    real_runner: Callable[[], contextlib.AbstractContextManager[ConfigRunner]],
    passes: int,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Freeze ``rows`` in ``res``, then run every configuration ``passes`` times, interleaved, with
    ``runner`` (a stand-in for tests) or the runner that ``real_runner()`` opens for the duration."""
    res.freeze(rows)  # every prediction is on disk before the first real run
    log(f"predictions frozen in {res.path}")
    with contextlib.ExitStack() as stack:
        run = runner if runner is not None else stack.enter_context(real_runner())
        return interleave(res, lambda i, p: run(res.doc["runs"][i]["config"], p), passes=passes, log=log)


def draw_seed(seed: int | None) -> int:
    """``seed``, or a fresh one (to be printed and stored) when None; a negative one is refused."""
    import secrets

    if seed is None:
        return secrets.randbelow(2**31)
    if seed < 0:
        raise UserError(f"--seed {seed}; expected an integer >= 0")
    return seed


def check_result_path(out: str | None, force: bool, default_name: str) -> Path:
    """The result file to write: ``out`` or ``out/<default_name>``; refused when it exists without
    ``force``, or when its folder is missing."""
    from trainsim.cli.options import check_new_file

    path = Path(out) if out else Path("out") / default_name
    check_new_file(str(path), force, "--out")
    if not path.parent.is_dir():
        if out:
            raise UserError(f"--out {out!r}: folder {path.parent} does not exist")
        path.parent.mkdir(parents=True)
    return path
