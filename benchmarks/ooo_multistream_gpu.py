"""One GPU, weight gradients on a second CUDA stream: measured against the simulator's prediction.

    python benchmarks/ooo_multistream_gpu.py [--json-out FILE]     # needs a CUDA device, ~3 min on an H100

Runs ``trainsim.validate.multistream``'s full case list (mlp and cnn at several batch sizes, from
host-bound to device-bound): profile every phase of the two-stream runner on the GPU (host and
device time apart), predict one stream, two streams with each W right after its B, and two streams
with the searched map, measure all three and PyTorch's own loop (medians of 3 runs of 50 steps).

Writes the ``ooo_multistream_gpu`` section of a record docs/benchmarks/ooo.<name>.json. Without a CUDA device it says
so and exits with code 2 (nothing is written); ``--device cpu`` smoke-tests the script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import record_report, stamp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json-out", type=Path, help="also write the result (with the profiles) as JSON here")
    ap.add_argument("--device", default="cuda", help="'cpu' only smoke-tests the script (writes nothing)")
    a = ap.parse_args(argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("ooo_multistream_gpu: no CUDA device here; this benchmark runs on a GPU only", file=sys.stderr)
        return 2
    from trainsim.validate.multistream import FULL, QUICK, StreamCase, run_multistream_validation

    head = stamp() if a.device == "cuda" else "(CPU smoke test)\n"
    out = run_multistream_validation(
        FULL if a.device == "cuda" else QUICK, device=a.device, log=lambda s: print(s, file=sys.stderr)
    )
    if a.json_out:
        a.json_out.write_text(json.dumps(out, indent=1))
    lines = [
        "## Single device, two CUDA streams: measured on a GPU",
        "",
        head,
        "Per configuration: one step's host issue time and device time from the profile, one stream "
        "(fused backward) / split, and the co-run factor (how much slower kernels run beside the other "
        "stream's, measured with two model copies); then per mode predicted / measured ms and the "
        "error. Speed-up: one "
        "stream over two streams with the searched map. Measured figures are medians of 3 runs of 50 "
        "steps; `torch loop` is PyTorch's own `loss.backward()` + `SGD` loop, for reference.",
        "",
        "| config | host ms one / split | device ms one / split | co-run factor | torch loop ms "
        "| one stream pred / meas (err) | BWD i pred / meas (err) | searched pred / meas (err) "
        "| speed-up pred / meas |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, c in enumerate(out["cases"]):
        runs = out["runs"][3 * i : 3 * i + 3]
        cells = [f"{r['predicted_ms']:.2f} / {r['measured_ms']:.2f} ({r['error_pct']:+.1f} %)" for r in runs]
        label = StreamCase(model=c["model"], batch=c["batch"], zoo=c["zoo"]).label
        lines.append(
            f"| {label} | {c['host_ms']:.2f} / {c['host_split_ms']:.2f} | {c['device_ms']:.2f} / "
            f"{c['device_split_ms']:.2f} | {c['stream_corun_factor']:.2f} | {c['torch_loop_ms']:.2f} | "
            + " | ".join(cells)
            + f" | {c['predicted_speedup']:.3f}x / {c['measured_speedup']:.3f}x |"
        )
    lines += [
        "",
        f"Mean absolute error {out['mean_abs_error_pct']:.2f} %, worst {out['max_abs_error_pct']:.2f} % over "
        f"{len(out['runs'])} predictions.",
    ]
    print("\n".join(lines))
    if a.device == "cuda":
        print(record_report("ooo", "multistream_gpu", "\n".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
