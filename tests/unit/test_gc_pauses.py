"""The garbage collector in a controller process: pauses timed, survivors of a full
collection frozen, and a sweep that reclaims a cycle which died while frozen."""

from __future__ import annotations

import gc
import weakref

import pytest
from prometheus_client import CollectorRegistry

from clusters.testing import eventually
from controller_kit.gc_pauses import GcPauses


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cycle detector can free it


@pytest.fixture
def pauses():
    # No automatic collections meanwhile (a thread another test left running could start
    # one): only the test's own are counted, and none keeps a sweep from collecting.
    enabled = gc.isenabled()
    gc.disable()
    registry = CollectorRegistry()
    installed = GcPauses(registry, sweep_seconds=0).install()
    try:
        yield installed, registry
    finally:
        installed.uninstall()
        if enabled:
            gc.enable()


def count(registry: CollectorRegistry, generation: str) -> float:
    return registry.get_sample_value("python_gc_duration_seconds_count",
                                     {"generation": generation}) or 0.0


def test_each_collection_is_timed_by_generation(pauses):
    _, registry = pauses
    # Every generation's series exists before its first collection.
    assert [count(registry, g) for g in ("0", "1", "2")] == [0.0, 0.0, 0.0]
    gc.collect()
    gc.collect(0)
    assert [count(registry, g) for g in ("0", "1", "2")] == [1.0, 0.0, 1.0]


def test_a_full_collection_freezes_its_survivors_and_a_sweep_reclaims_what_died_frozen(pauses):
    installed, _ = pauses
    node = Node()
    gone = weakref.ref(node)
    gc.collect()
    assert gc.get_freeze_count() > 0, "a full collection should freeze its survivors"
    del node
    gc.collect()
    # The cycle became garbage while frozen: collections do not walk it.
    assert gone() is not None, "a collection walked the frozen objects"
    swept = installed.sweep()
    assert gone() is None, "the sweep did not reclaim the cycle that died while frozen"
    assert swept["collected"] >= 1 and swept["frozen"] > 0, swept
    assert gc.get_freeze_count() >= swept["frozen"] > 0, (
        "the sweep's own full collection should freeze again")


def test_uninstall_hands_everything_back(pauses):
    installed, _ = pauses
    gc.collect()
    installed.uninstall()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gc.get_freeze_count() == 0, "a full collection froze after uninstall"


def test_the_sweeps_come_by_themselves():
    installed = GcPauses(CollectorRegistry(), sweep_seconds=0.05).install()
    try:
        node = Node()
        gone = weakref.ref(node)
        gc.collect()  # frozen, alive
        del node
        # Observed as a bool: holding the object itself would keep it alive.
        eventually(lambda: gone() is None, bool, timeout=10, interval=0.02,
                   expected="a sweep of the sweep thread reclaiming a cycle that died frozen")
    finally:
        installed.uninstall()
