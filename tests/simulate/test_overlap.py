"""What tasks running at the same time cost each other, from a schedule (simulate.overlap)."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.simulate.overlap import corun_extra_us, overlap_us


def test_overlap_is_the_integral_of_the_load() -> None:
    # transfers: [0, 10) using half a core, [5, 15) using half a core -> load 0.5, 1.0, 0.5
    start = np.array([0.0, 5.0, 0.0, 12.0, 20.0])
    end = np.array([10.0, 15.0, 20.0, 14.0, 30.0])
    out = overlap_us(start, end, np.array([0, 1]), np.array([0.5, 0.5]), np.array([2, 3, 4]))
    assert out[2] == pytest.approx(0.5 * 5 + 1.0 * 5 + 0.5 * 5)  # all of it
    assert out[3] == pytest.approx(0.5 * 2)  # [12, 14): only the second transfer
    assert out[4] == 0.0  # after every transfer
    assert out[0] == out[1] == 0.0  # sources are not destinations
    capped = overlap_us(start, end, np.array([0, 1]), np.array([0.5, 0.5]), np.array([2]), cap=0.5)
    assert capped[2] == pytest.approx(0.5 * 15)


def test_corun_extra_is_zero_on_one_thread_or_without_a_factor() -> None:
    start, end, res = np.array([0.0, 50.0]), np.array([100.0, 150.0]), np.array([0, 0])
    assert not corun_extra_us(start, end, res, np.array([0, 1]), 2.0).any()  # one rank never slows itself
    assert not corun_extra_us(start, end, np.array([0, 1]), np.array([0, 1]), 1.0).any()
    # on two threads, 50 us of overlap each at factor 2: 25 us more each
    assert corun_extra_us(start, end, np.array([0, 1]), np.array([0, 1]), 2.0) == pytest.approx([25.0, 25.0])
