"""The garbage collector in a controller process: pauses timed, survivors of a full
collection frozen, and a sweep that reclaims a cycle which died while frozen."""

from __future__ import annotations

import gc
import weakref

import pytest
from prometheus_client import CollectorRegistry

from trainjob.gc_pauses import GcPauses


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cycle detector can free it


@pytest.fixture
def pauses():
    registry = CollectorRegistry()
    installed = GcPauses(registry, sweep_seconds=0).install()
    try:
        yield installed, registry
    finally:
        installed.uninstall()


def count(registry: CollectorRegistry, generation: str) -> float:
    return registry.get_sample_value("python_gc_duration_seconds_count",
                                     {"generation": generation}) or 0.0


def test_each_collection_is_timed_by_generation(pauses):
    installed, registry = pauses
    before = count(registry, "2"), count(registry, "0")
    gc.collect()
    gc.collect(0)
    assert count(registry, "2") == before[0] + 1
    assert count(registry, "0") == before[1] + 1
    assert installed.last["generation"] == 0 and installed.last["seconds"] >= 0


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
