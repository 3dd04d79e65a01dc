"""``trainsim validate calibrate``: measure this machine once for every validation (``testbed.machine``).

    $ trainsim validate calibrate                 # writes ~/.cache/trainsim/machine.json
    $ trainsim validate calibrate --recalibrate --json
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from trainsim.testbed.machine import MachineCalibration, default_path, load_machine


def _grid_text(cal: MachineCalibration) -> str:
    """``efficiency_grid`` in one line: per rate, the percentages at each size."""
    if not cal.efficiency_grid:
        return "not measured"
    sizes = ", ".join(f"{s >> 10} KB" for s in cal.shaped_sizes_bytes)
    rows = [f"{r:g} Mbit/s: " + ", ".join(f"{100 * e:.0f} %" for e in row)
            for r, row in zip(cal.shaped_rates_mbit, cal.efficiency_grid, strict=True)]  # fmt: skip
    return f"{'; '.join(rows)} at {sizes}"


def _wire_text(cal: MachineCalibration) -> str:
    """``wire_us_per_byte`` in one line: per rate, ns per byte."""
    if not cal.wire_us_per_byte:
        return "not measured"
    return ", ".join(f"{r:g} Mbit/s {1e3 * w:.1f} ns" for r, w in zip(cal.wire_rates_mbit, cal.wire_us_per_byte, strict=True))


def _fused_text(cal: MachineCalibration) -> str:
    """``fused_adam_gbps`` in one line: GB/s at each size."""
    if not cal.fused_adam_gbps:
        return "not measured"
    return ", ".join(f"{g:.1f} GB/s at {s >> 10} KB" for s, g in zip(cal.fused_adam_sizes_bytes, cal.fused_adam_gbps, strict=True))


@click.command("calibrate")
@click.option("--file", "file", type=click.Path(dir_okay=False), default=None,
              help="Calibration file (default ~/.cache/trainsim/machine.json).")
@click.option("--recalibrate", is_flag=True, help="Measure again and replace the file.")
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as one JSON object.")
def calibrate_command(file: str | None, recalibrate: bool, as_json: bool) -> None:  # fmt: skip
    """Measure this machine once for every validation: link, host speed, fused optimizer kernel, co-run slowdown."""
    from rich.console import Console

    from trainsim.validate import progress_log

    path = Path(file) if file else default_path()
    fresh = recalibrate or not path.exists()
    cal, path = load_machine(path, recalibrate=recalibrate, log=progress_log(Console(stderr=True)))
    out = {"file": str(path), "measured_now": fresh, **asdict(cal)}
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{'measured' if fresh else 'loaded'} {path} ({cal.created_at}): all-reduce host cost "
               f"{cal.host_a_us:.0f} us + {cal.host_b_us_per_byte * 1e3:.3f} us/KB, a shaped link delivers "
               f"{100 * cal.link_efficiency:.0f} % of its rate (median; {_grid_text(cal)}), standard kernel {cal.kernel_ms:.3f} ms, co-run "
               f"slowdown {cal.corun_slowdown}, computation lost per byte sent on a shaped link {_wire_text(cal)}, fused Adam "
               f"kernel {_fused_text(cal)}")  # fmt: skip
