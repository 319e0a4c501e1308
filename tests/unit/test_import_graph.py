"""The dispatcher's packages import downward only: ``room`` (what a worker can hold) <-
``workers`` <- ``placement`` <- ``standalone`` / ``kueue`` <- the wiring, never in a
circle; and the dispatcher and the operator never import each other. Read from the
source (every import, at any depth of a module), not from what happens to be loaded."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _unit(module: str) -> str:
    """The node a module counts as: its sub-package of ``dispatcher`` (``dispatcher.room``)
    or, for a module directly in ``dispatcher/``, the module itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        unit = _unit(module)
        targets = {_unit(name) for name in _imports(path)
                   if name.startswith(f"{package}.") and _is_module(name)}
        graph.setdefault(unit, set()).update(targets - {unit})
    return graph


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of the tree (not a name imported from one)."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path round it, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_dispatchers_packages_import_in_no_circle():
    graph = _graph("dispatcher")
    assert {"dispatcher.room", "dispatcher.workers", "dispatcher.placement"} <= graph.keys()
    cycle = _cycle(graph)
    assert cycle is None, "dispatcher packages import one another in a circle: " + \
        " -> ".join(cycle)


def test_room_imports_none_of_the_packages_that_decide_or_connect():
    above = {"dispatcher.workers", "dispatcher.placement", "dispatcher.standalone",
             "dispatcher.kueue", "dispatcher.controller"}
    assert not _graph("dispatcher")["dispatcher.room"] & above


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_dispatcher_and_operator_never_import_each_other():
    for path in sorted((ROOT / "dispatcher").rglob("*.py")):
        assert not {n for n in _imports(path) if n.startswith("training_operator")}, path
    for path in sorted((ROOT / "operator").rglob("*.py")):
        assert not {n for n in _imports(path) if n.startswith("dispatcher")}, path


def test_the_controller_plumbing_imports_nothing_of_the_project():
    """controller_kit sits below everything: the domain package, the dispatcher and the
    operator import it, never the reverse."""
    project = ("trainjob", "dispatcher", "training_operator", "clusters", "bench")
    for path in sorted((ROOT / "controller_kit").rglob("*.py")):
        found = {n for n in _imports(path) if n.split(".")[0] in project}
        assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"
