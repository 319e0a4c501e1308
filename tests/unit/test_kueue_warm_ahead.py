"""Kueue mode warms ahead as standalone mode does: a Workload seen for the first time has
its pod shapes scored on each worker (``Placer.warm_need_ahead``) on the placer's warming
thread, before any decision is made about it, and its nomination's decision takes those
heaps (pure: the Workload cache's handler is called as the cache calls it)."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client
from test_placer import runtime
from test_placer import worker as worker_cluster

from clusters.testing import eventually
from controller_kit.events import EventRecorder
from dispatcher.config import DispatcherConfig
from dispatcher.kueue.nominator import WorkloadNominator
from dispatcher.metrics import DispatcherMetrics
from dispatcher.placement.placer import Placer

from worker_fakes import Registry

JOB = ("ns", "train-a")


def workload(**status) -> dict:
    """The Workload Kueue makes for TrainJob ns/train-a: two pods of 2 CPUs."""
    return {
        "metadata": {"namespace": "ns", "name": "trainjob-train-a-1", "uid": "w-1",
                     "generation": 1, "resourceVersion": "5",
                     "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                          "kind": "TrainJob", "name": "train-a",
                                          "uid": "t-1", "controller": True}]},
        "spec": {"queueName": "user-queue", "podSets": [{
            "name": "node", "count": 2,
            "template": {"spec": {"containers": [{
                "name": "node", "image": "trainer",
                "resources": {"requests": {"cpu": "2"}}}]}}}]},
        "status": status}


class Kueue:
    """A nominator over two workers; ``idle`` says whether Kueue waits for it."""

    def __init__(self, idle: bool = False):
        self.workers = [worker_cluster(f"worker-{index}", index, runtime(f"u{index}", "5", "2"))
                        for index in (1, 2)]
        self.placer = Placer(Registry(*self.workers), "best-fit")
        api = client.ApiClient()  # never asked: nothing here writes
        config = DispatcherConfig(mode="kueue", namespace="trainjob-system")
        self.nominator = WorkloadNominator(
            api, self.placer.registry, self.placer, config, EventRecorder(api, "test"),
            DispatcherMetrics(),
            lambda: (idle, "Kueue nominates workers itself" if idle else ""))

    def warmed(self) -> list[int]:
        return [len(each.capacity._warmed) for each in self.workers]

    def warming_ended(self) -> None:
        thread = self.placer.threads()[0]
        assert thread is not None, "no warming was queued"
        thread.join(5)
        assert not thread.is_alive()


def test_a_workload_seen_is_warmed_ahead_before_its_decision_which_takes_the_heaps():
    kueue = Kueue()
    seen = workload()
    kueue.nominator._on_workload("ADDED", None, seen)
    eventually(kueue.warmed, lambda counts: counts == [1, 1], timeout=10,
               expected="one heap warmed on each worker for the Workload's one pod shape")
    # No decision yet: the Workload only waits in the queue, no room is held for it.
    assert len(kueue.nominator.queue) == 1
    assert not any(each.capacity.reserved(JOB) for each in kueue.workers)
    # The decision: the size worked out on the warming thread is the one kept for it,
    # and the chosen worker's decision takes the warmed heap.
    need = kueue.nominator._size(seen, False)
    chosen, _ = kueue.placer.place_need(JOB, need, {})
    assert chosen.capacity.reserved(JOB)
    assert not chosen.capacity._warmed, "the decision took the warmed heap"
    chosen.capacity.check()


@pytest.mark.parametrize("status", [
    {"nominatedClusterNames": ["worker-1"]},
    {"clusterName": "worker-1"},
    {"conditions": [{"type": "Finished", "status": "True"}]},
], ids=["nominated", "admitted", "finished"])
def test_a_workload_that_waits_for_no_nomination_is_not_warmed(status):
    kueue = Kueue()
    kueue.nominator._on_workload("ADDED", None, workload(**status))
    assert kueue.placer.threads() == [None], "a warming was queued"
    assert len(kueue.nominator.queue) == 1 and kueue.warmed() == [0, 0]


def test_a_workload_changed_is_not_warmed_again():
    kueue = Kueue()
    before = workload()
    after = copy.deepcopy(before)
    after["metadata"]["resourceVersion"] = "6"
    kueue.nominator._on_workload("MODIFIED", before, after)
    assert kueue.placer.threads() == [None], "a warming was queued for a change"


def test_nothing_is_warmed_while_kueue_does_not_wait_for_this_dispatcher():
    kueue = Kueue(idle=True)
    kueue.nominator._on_workload("ADDED", None, workload())
    kueue.warming_ended()
    assert kueue.warmed() == [0, 0]
