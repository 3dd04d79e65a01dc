"""No import cycles between trainsim's modules, counting imports inside functions too."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_graph() -> dict[str, set[str]]:
    mods = {}
    for p in SRC.rglob("*.py"):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m}
    return graph


def test_no_module_imports_itself_back() -> None:
    try:
        graphlib.TopologicalSorter(_module_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_the_checker_sees_a_cycle() -> None:
    g = {"a": {"b"}, "b": {"a"}}
    try:
        graphlib.TopologicalSorter(g).prepare()
    except graphlib.CycleError:
        return
    raise AssertionError("graphlib missed a two-module cycle")


def test_only_validate_and_the_calibrate_command_use_the_test_bed() -> None:
    """What-ifs, replay and the planner never import ``trainsim.testbed`` (docs/architecture.md); the
    validations do, and ``trainsim calibrate``, which measures links on this host."""
    allowed = ("trainsim.testbed", "trainsim.validate", "trainsim.cli.cluster")
    users = {m for m, deps in _module_graph().items() if any(d.startswith("trainsim.testbed") for d in deps)}
    assert users and not {m for m in users if not m.startswith(allowed)}, sorted(users)


def _package_graph() -> dict[str, set[str]]:
    def area(m: str) -> str:
        return ".".join(m.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for m, deps in _module_graph().items():
        graph.setdefault(area(m), set()).update(area(d) for d in deps if area(d) != area(m))
    return graph


def test_no_area_imports_another_that_imports_it_back() -> None:
    """Areas (``trainsim.capture``, ``trainsim.run`` ...) form no cycle either: the pipeline reads
    capture -> graph -> transform -> simulate, the other areas beside them, nothing pointing back."""
    try:
        graphlib.TopologicalSorter(_package_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle between areas: {' -> '.join(e.args[1])}") from None
