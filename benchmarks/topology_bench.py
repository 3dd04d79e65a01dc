"""Rolling parameter servers and gossip averaging on real gloo ranks over shaped links, predicted first.

    realrun .venv/bin/python benchmarks/topology_bench.py                  # 200 Mbit/s namespaces, ~3 min
    realrun .venv/bin/python benchmarks/topology_bench.py --rate-mbit 0    # unshaped links

1. Prediction, before any run, from the model and this host's calibration only: ``load_machine()``'s
   one-message line (``p2p_line``) and its shaped link's efficiency give one ``Link``
   (``topologies.calibrated_link``); ``sync_us`` (``ring_allreduce_us`` for gloo's all-reduce, the
   reference) gives each pattern's time for 2, 3 and 4 ranks at each size. Written to
   docs/benchmarks/topologies.json with the time it was frozen.
2. Four network namespaces on links of ``--rate-mbit`` (``Netns``, star: each rank its own up- and
   down-link); per world size one launch of ``run/topo_worker.py`` on the first ranks' namespaces:
   every pattern at every size, ``--reps`` repetitions after one warm-up, the order rotated.
3. Measured: per repetition the slowest rank's time, the median over repetitions; error = predicted /
   measured - 1.

Writes docs/benchmarks/topologies.json (every figure) and the record cluster.topologies.json
(``python3 dev.py results`` renders it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = [256 << 10, 1 << 20, 4 << 20]
WORLDS = [2, 3, 4]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--rate-mbit", type=float, default=200.0, help="link rate of the namespaces (0: unshaped)"
    )
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "topologies.json")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from results import command_line, record
    from trainsim.cluster.topologies import calibrated_link
    from trainsim.run.ranks import local_popen
    from trainsim.run.topo_worker import PATTERNS, TopoRunConfig, predict_ms, run_topologies
    from trainsim.testbed.machine import load_machine
    from trainsim.testbed.netns import Netns, netns_unavailable

    rate = a.rate_mbit or None
    notes: list[str] = [
        "The workers post their receives before their sends; an earlier run that posted the sends first "
        "(topologies_sends_first.json, same predictions) measured rolling_ps and gossip_ring up to 2.3x the model."
    ]
    reason = netns_unavailable()
    if reason is not None:
        notes.append(f"network namespaces unavailable ({reason}); ran on unshaped loopback")
        rate = None
    cal, cal_path = load_machine()
    link = calibrated_link(p2p_line=cal.p2p_line, rate_mbit=rate, efficiency=cal.efficiency(rate))
    cfgs = {p: TopoRunConfig(world_size=p, sizes_bytes=SIZES, reps=a.reps) for p in WORLDS}
    pred = {str(p): {pat: {str(s): predict_ms(cfgs[p], pat, s, link) for s in SIZES} for pat in PATTERNS}
            for p in WORLDS}  # fmt: skip
    doc: dict[str, Any] = {
        "command": command_line(), "network": f"{rate:g} Mbit/s per link, star of namespaces" if rate else "unshaped",
        "calibration": cal.describe(cal_path), "p2p_line": list(cal.p2p_line),
        "link": {"latency_us": link.latency_us, "bytes_per_us": link.bytes_per_us}, "prediction_ms": pred,
        "predictions_frozen_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "notes": notes,
    }  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")  # the predictions, before any run
    runs: dict[str, Any] = {}
    if reason is None:
        with Netns(max(WORLDS), rate_mbit=rate) as net:

            def popen(rank: int, argv: list[str], **kw: Any) -> Any:
                env = dict(os.environ, GLOO_SOCKET_IFNAME=net.ifname, OMP_NUM_THREADS="1")
                return net.popen(rank, argv, env=env, **kw)

            for p in WORLDS:
                runs[str(p)] = run_topologies(cfgs[p], popen=popen, master=net.addr(0))
    else:
        for p in WORLDS:
            runs[str(p)] = run_topologies(cfgs[p], popen=local_popen)
    doc["runs"] = runs
    rows, errs = [], {pat: [] for pat in PATTERNS}
    for p in WORLDS:
        for pat in PATTERNS:
            for s in SIZES:
                m = runs[str(p)]["median_ms"][pat][str(s)]
                pr = pred[str(p)][pat][str(s)]
                e = 100 * (pr["model"] / m - 1)
                errs[pat].append(e)
                rows.append([pat, p, s >> 10, round(pr["model"], 1), round(pr.get("graphs", pr["model"]), 1),
                             round(m, 1), round(e, 1)])  # fmt: skip
    doc["errors_pct"] = errs
    doc["max_result_error"] = {p: r["max_error"] for p, r in runs.items()}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    rows.sort(key=lambda r: (r[2] != max(SIZES) >> 10, r[0], r[1], r[2]))  # largest size first on the page
    summary = [
        f"Link model from {cal_path.name} only: alpha {link.latency_us:.0f} µs per message, "
        f"{link.bytes_per_us:.2f} bytes/µs ({doc['network']}); predictions frozen at {doc['predictions_frozen_at']}.",
        *[f"{pat}: median |error| {statistics.median(abs(e) for e in errs[pat]):.0f} % over {len(errs[pat])} "
          f"(ranks, size) pairs, range {min(errs[pat]):+.0f} to {max(errs[pat]):+.0f} %" for pat in PATTERNS],
        "Each row: median of the repetitions' slowest-rank times. `graphs` is the model on the peer graphs the "
        "run drew (gossip_random only; else the model). allreduce is gloo's own, as a reference.",
        *notes,
    ]  # fmt: skip
    record(
        "cluster", "topologies", command=doc["command"],
        title="Rolling parameter servers and gossip: alpha-beta model vs real gloo runs",
        headline={"columns": ["pattern", "ranks", "KiB", "predicted ms", "on drawn graphs ms", "measured ms",
                              "error %"], "rows": rows},
        summary=summary, raw=[a.out.name], data=doc,
    )  # fmt: skip
    print("\n".join(summary))
    for r in rows:
        print(*r, sep="\t")
    return 0


if __name__ == "__main__":
    sys.exit(main())
