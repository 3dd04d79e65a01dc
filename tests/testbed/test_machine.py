"""The machine calibration's shaped-link rates: generic, and spanning the validations' fixed rates."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from trainsim.testbed import machine as mc
from trainsim.validate import dp, ooo, pipeline
from trainsim.validate import whatif as wi


def _fixed_rates() -> set[float]:
    """Every link rate a fixed (not drawn) validated configuration runs at, delays or not."""
    rates = {float(r) for p in wi.fixed_pairs(False) for r in (p.first.rate_mbit, p.second.rate_mbit) if r}
    rates |= {float(c.rate_mbit) for c in (*dp.FULL, *dp.QUICK) if c.rate_mbit}
    rates |= {float(c.rate_mbit) for c in (*ooo.FULL, *ooo.QUICK) if c.rate_mbit}
    rates |= {float(pipeline.FULL.rate_mbit)} if pipeline.FULL.rate_mbit else set()
    return rates


def test_calibrated_rates_span_the_validated_rates_without_measuring_one() -> None:
    """Out of sample: no calibrated rate is a fixed validation's rate. And every fixed rate from the
    lowest calibrated one up lies between two measured rates, so that its efficiency is interpolated,
    not the top row held (before: 60 and 240 Mbit/s only, the pairs' 400-1000 Mbit/s held at 240)."""
    rates = _fixed_rates()
    assert rates & {1000.0, 400.0}  # the network pairs' rates are among them
    assert not rates & set(mc.CAL_RATES_MBIT)
    lo, hi = min(mc.CAL_RATES_MBIT), max(mc.CAL_RATES_MBIT)
    above = sorted(r for r in rates if r >= lo)
    assert above and all(r <= hi for r in above), (above, mc.CAL_RATES_MBIT)
    assert list(mc.CAL_RATES_MBIT) == sorted(set(mc.CAL_RATES_MBIT))


def _cal(grid: list[list[float]]) -> mc.MachineCalibration:
    """A calibration by hand with the current rates: host line 100 us + 0.001 us/B, sizes 1 and 16 MB."""
    return mc.MachineCalibration(
        machine=mc.identity(), version=mc.version(), created_at="2026-11-29T00:00:00+00:00", sizes_bytes=[1, 2],
        loopback_us=[100.0, 100.0], host_a_us=100.0, host_b_us_per_byte=0.001,
        shaped_rates_mbit=list(mc.CAL_RATES_MBIT), shaped_sizes_bytes=[1 << 20, 16 << 20], shaped_us=[],
        efficiency_grid=grid, link_efficiency=0.9, allgather_loopback_us=[], allgather_line=(80.0, 0.002),
        p2p_loopback_us=[], p2p_line=(50.0, 0.0005), kernel_ms=0.4, corun_slowdown={"2": 1.05}, load_avg=0.1,
    )  # fmt: skip


def test_efficiency_above_240_reads_the_higher_rows() -> None:
    """60 / 240 / 600 / 1500 Mbit/s rows of 0.9, 0.9, 0.96, 1.0 at both sizes. At 1000 Mbit/s: 600's row
    and 1500's, ln(1000/600) / ln(1500/600) = 0.5575 of the way: 0.96 + 0.04 x 0.5575 = 0.9823; at 400:
    between 240 and 600, ln(400/240) / ln(600/240) = 0.5575: 0.9335. Above 1500 the top row is held. A
    2-rank all-reduce of 8 MB at 1000 Mbit/s then costs 100 + 8,388.6 host + 67,108.9 / 0.9823 us on the
    wire, not the 240 row's 67,108.9 / 0.9."""
    assert len(mc.CAL_RATES_MBIT) == 4
    cal = _cal([[0.9, 0.9], [0.9, 0.9], [0.96, 0.96], [1.0, 1.0]])
    f = math.log(1000 / 600) / math.log(1500 / 600)
    assert cal.efficiency(1000, 4 << 20) == pytest.approx(0.96 + 0.04 * f)
    assert cal.efficiency(400, 4 << 20) == pytest.approx(0.9 + 0.06 * math.log(400 / 240) / math.log(600 / 240))
    assert cal.efficiency(2000, 4 << 20) == pytest.approx(1.0)
    wire = (8 << 20) * 8 / 1000
    assert cal.allreduce_us(8 << 20, rate_mbit=1000) == pytest.approx(100 + 0.001 * (8 << 20) + wire / (0.96 + 0.04 * f))
    # the old two-row file held 240's 0.9 at every higher rate
    old = replace(cal, shaped_rates_mbit=[60.0, 240.0], efficiency_grid=[[0.9, 0.9], [0.9, 0.9]])
    assert old.efficiency(1000, 4 << 20) == pytest.approx(0.9)


def test_a_file_of_the_previous_format_is_refused(tmp_path: object) -> None:
    """A format-5 file (efficiency measured at 60 and 240 Mbit/s only) asks for a new calibration."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    from trainsim.errors import UserError

    assert mc.FORMAT >= 6
    f = Path(str(tmp_path)) / "machine.json"
    old = replace(_cal([[0.9, 0.9], [0.9, 0.9]]), shaped_rates_mbit=[60.0, 240.0],
                  version=mc.version().rsplit("/", 1)[0] + "/5")  # fmt: skip
    f.write_text(json.dumps(asdict(old)))
    with pytest.raises(UserError, match="recalibrate") as e:
        mc.load_machine(f)
    assert "\n" not in str(e.value)


def test_efficiency_row_is_the_mean_of_the_launches() -> None:
    """Two launches at 1500 Mbit/s, host line 2,000 us + 0.001 us/B. 16 MB: the launches' 100 and 120 ms
    make 110 ms; less the host's 2,000 + 16,777.2 us that is 91,222.8 us for a nominal 89,478.5 us:
    0.9809. 4 MB: 30 and 40 ms make 35 ms, less 6,194.3 us is 28,805.7 for a nominal 22,369.6: 0.7766.
    256 KB and 1 MB faster than the host line alone: the delivered rate is held at 1."""
    launches = [[2_000.0, 3_000.0, 30_000.0, 100_000.0], [2_500.0, 3_500.0, 40_000.0, 120_000.0]]
    times, row = mc.efficiency_row(launches, 1500.0, (2_000.0, 0.001))
    assert times == [2_250.0, 3_250.0, 35_000.0, 110_000.0]
    assert row == pytest.approx([1.0, 1.0, 0.7766, 0.9809], abs=1e-4)
    # one launch, with 1 ms added one way: two ring steps of two latencies come off too (0.9203)
    _, one = mc.efficiency_row([launches[1]], 1500.0, (2_000.0, 0.001), delay_ms=1.0)
    assert one[3] == pytest.approx((16 << 20) * 8 / 1500 / (120_000 - 2_000 - 0.001 * (16 << 20) - 4_000), abs=1e-4)
