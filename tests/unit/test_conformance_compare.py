"""The conformance table's comparison of two objects: lists of named items by name (their
order counted, except a container's env, whose order upstream leaves to chance)."""

from __future__ import annotations

from clusters.conformance.compare import differing_paths


def _container(env: list[tuple[str, str]], ports: list[str]) -> dict:
    return {"env": [{"name": n, "value": v} for n, v in env],
            "ports": [{"name": p} for p in ports]}


def test_named_items_compare_by_name_and_value():
    left = _container([("A", "1"), ("B", "2")], ["x"])
    right = _container([("A", "1"), ("B", "3")], ["x"])
    assert differing_paths(left, right) == [".env[B].value"]


def test_order_counts_except_for_env():
    left = _container([("A", "1"), ("B", "2")], ["x", "y"])
    right = _container([("B", "2"), ("A", "1")], ["y", "x"])
    assert differing_paths(left, right) == [".ports (order)"]


def test_a_missing_item_is_named():
    left = _container([("A", "1")], [])
    right = _container([("A", "1"), ("C", "0")], [])
    assert differing_paths(left, right) == [".env[C]"]
