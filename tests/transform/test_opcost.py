"""The op cost model: log-space interpolation of a calibration table, shape ratios, the cache."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trainsim.transform import opcost

GRID = (1, 4, 16, 64, 256, 1024, 4096)


def fake_table() -> opcost.OpCostTable:
    """A table with t = 2 sqrt(m) k n µs for every matmul layout (log-linear, so interpolation is exact),
    and t = 1 + bytes / 1000 µs for elementwise ops."""
    m, k, n = np.meshgrid(*(np.array(GRID, np.float64),) * 3, indexing="ij")
    mm = 2 * np.sqrt(m) * k * n
    axes = {f"matmul_{lay}": (GRID,) * 3 for lay in ("nn", "nt", "tn", "tt")}
    us = {kind: mm for kind in axes}
    byte_axis = tuple(2**i for i in range(6, 21))
    axes["elementwise"] = (byte_axis,)
    us["elementwise"] = 1 + np.array(byte_axis, np.float64) / 1000
    return opcost.OpCostTable(axes=axes, us=us, machine={"cpu": "fake"})


def test_interpolation_is_log_linear_constant_below_and_linear_above() -> None:
    t = fake_table()
    assert t.time_us("matmul_nn", [32, 64, 8]) == pytest.approx(2 * math.sqrt(32) * 64 * 8)
    assert t.time_us("matmul_nn", [1, 1, 1]) == pytest.approx(2)
    assert t.time_us("matmul_nn", [0.5, 1, 1]) == pytest.approx(2)  # below the grid: the floor
    assert t.time_us("matmul_nn", [8192, 1, 1]) == pytest.approx(2 * 64 * 2)  # above: linear
    # between two grid points of a non-power law: the geometric mean of the neighbours' times
    assert t.time_us("elementwise", [2**7 * math.sqrt(2)]) == pytest.approx(math.sqrt(1.128 * 1.256))
    with pytest.raises(Exception, match="sizes"):
        t.time_us("matmul_nn", [1, 2])


def test_shape_ratio_of_matmul_conv_elementwise_and_unknown_ops() -> None:
    t = fake_table()
    old, new = [[1024], [32, 1024], [1024, 1024], [], []], [[1024], [64, 1024], [1024, 1024], [], []]
    assert opcost.shape_ratio(t, "aten::addmm", old, new) == pytest.approx(math.sqrt(2))
    # the weight-gradient GEMM: the batch is the contracted dimension, linear in the fake model
    assert opcost.shape_ratio(
        t, "aten::mm", [[1024, 32], [32, 256]], [[1024, 64], [64, 256]]
    ) == pytest.approx(2)
    assert (
        opcost.model_point("aten::mm", [[1024, 32], [32, 256]], strides=[[1, 1024], [256, 1]])[0]
        == "matmul_tn"
    )  # type: ignore[index]
    r = opcost.shape_ratio(t, "aten::relu", [[32, 1000]], [[64, 1000]])
    assert r == pytest.approx((1 + 2 * 256_000 / 1000) / (1 + 2 * 128_000 / 1000), rel=1e-3)  # read + write
    assert opcost.shape_ratio(t, "aten::linear", old, new) is None  # no model: the caller scales linearly
    assert opcost.shape_ratio(t, "aten::mkldnn_convolution", [[8, 3, 32, 32], [16, 3, 3, 3]],
                              [[16, 3, 32, 32], [16, 3, 3, 3]]) is None  # no conv kind in this table  # fmt: skip


def test_calibration_is_cached_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_calibrate(log: object = None) -> opcost.OpCostTable:
        calls.append(1)
        t = fake_table()
        return opcost.OpCostTable(axes=t.axes, us=t.us, machine=opcost.machine_identity(1))

    monkeypatch.setattr(opcost, "calibrate", fake_calibrate)
    path = tmp_path / "opcost.json"
    a = opcost.load_or_calibrate(path)
    b = opcost.load_or_calibrate(path)
    assert len(calls) == 1 and b.time_us("matmul_nn", [16, 16, 16]) == pytest.approx(
        a.time_us("matmul_nn", [16, 16, 16])
    )
    doc = json.loads(path.read_text())
    doc["machine"]["cpu"] = "another cpu"
    path.write_text(json.dumps(doc))
    opcost.load_or_calibrate(path)
    opcost.load_or_calibrate(path, recalibrate=True)
    assert len(calls) == 3


def test_cache_sizes_come_from_sysfs_data_caches(tmp_path: Path) -> None:
    for i, (level, kind, size) in enumerate([(1, "Data", "64K"), (1, "Instruction", "64K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32768K")]):  # fmt: skip
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert opcost._cache_bytes(2, tmp_path) == 2**20
    assert opcost._cache_bytes(None, tmp_path) == 32 * 2**20  # the last level
    assert opcost._cache_bytes(4, tmp_path) == 0 and opcost._cache_bytes(None, tmp_path / "none") == 0


def cliff_table() -> opcost.OpCostTable:
    """Elementwise only: 1 µs per KiB up to 64 KiB, then 4 µs per KiB (past a cache: streaming is slower)."""
    axis = tuple(2**i for i in range(10, 21))
    us = np.array([b / 1024 if b <= 2**16 else 64 + 4 * (b - 2**16) / 1024 for b in axis], np.float64)
    return opcost.OpCostTable(axes={"elementwise": (axis,)}, us={"elementwise": us}, machine={"cpu": "fake"})


def test_work_beyond_the_bytes_cost_scales_with_the_bytes() -> None:
    """A memory-bound op traced at its table time follows the table; one traced slower than moving its
    bytes costs does per-element work, and that share scales with the bytes, not along the cache curve."""
    t = cliff_table()
    old, new = [[2, 2**12]], [[4, 2**12]]  # 32 KiB read + 32 KiB written -> twice that
    table = t.time_us("elementwise", [2**17]) / t.time_us("elementwise", [2**16])
    assert table == pytest.approx(5.0)  # 64 µs -> 64 + 4 * 64 µs: the cliff
    assert opcost.shape_ratio(t, "aten::relu", old, new) == pytest.approx(table)
    assert opcost.shape_ratio(t, "aten::relu", old, new, traced_us=64.0) == pytest.approx(table)
    assert opcost.shape_ratio(t, "aten::relu", old, new, traced_us=50.0) == pytest.approx(table)  # faster: table
    # max pooling traced at 10x the bytes' cost: a tenth follows the table, the rest doubles with the bytes
    pool = opcost.shape_ratio(t, "aten::max_pool2d_with_indices", [[2, 2**12], [], []], [[4, 2**12], [], []],
                              traced_us=640.0)  # fmt: skip
    assert pool == pytest.approx(0.1 * 5.0 + 0.9 * 2.0)
    # kinds with their own compute tables ignore it
    f = fake_table()
    assert opcost.shape_ratio(f, "aten::mm", [[1024, 32], [32, 256]], [[1024, 64], [64, 256]],
                              traced_us=1e9) == pytest.approx(2)  # fmt: skip
