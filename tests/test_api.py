"""The top-level API: every name in ``trainsim.__all__`` resolves, and ``import trainsim`` stays cheap."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
import types

import trainsim


def test_every_name_in_all_resolves() -> None:
    assert trainsim.__all__ == sorted(trainsim.__all__)
    assert set(trainsim.__all__) == set(trainsim._LAZY)
    for name in trainsim.__all__:
        value = getattr(trainsim, name)
        assert value is not None, name
        assert name in dir(trainsim)


def test_entry_points_are_the_functions_they_name() -> None:
    from trainsim.plan.estimate import estimate
    from trainsim.plan.search import plan
    from trainsim.simulate.engine import simulate
    from trainsim.transform.primitives import select

    assert trainsim.replay is simulate
    assert trainsim.search_plans is plan
    assert trainsim.estimate is estimate
    assert trainsim.select is select
    assert isinstance(trainsim.whatifs, types.ModuleType)
    # a second look gives the same object (a subpackage imported in between does not replace it)
    importlib.import_module("trainsim.simulate.engine")
    assert trainsim.replay is simulate
    assert isinstance(trainsim.simulate, types.ModuleType)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        trainsim.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("trainsim.no_such_thing resolved")


def test_import_trainsim_does_not_import_torch_or_numpy() -> None:
    code = "import sys, trainsim; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'numba'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_module_docstring_example_runs() -> None:
    res = doctest.testmod(trainsim)
    assert res.attempted > 0
    assert res.failed == 0
