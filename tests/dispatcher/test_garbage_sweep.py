"""The garbage-collection sweep against real API servers: a copy goes only when the manager
TrainJob the API server has now makes it garbage, not when the manager's cache is behind.

The two caches a sweep reads are fed by two watches on two servers: the worker's may show a
copy just made while the manager's does not show yet the placement written before it. Here
the manager's cache is one that has not listed anything yet, the extreme of that lag."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from kubernetes import client

from clusters.conformance.updates import read_or_none
from clusters.testing import eventually
from controller_kit.informer import Informer
from dispatcher.metrics import DispatcherMetrics
from dispatcher.standalone import mirror
from dispatcher.standalone.garbage_collection import sweep
from dispatcher.workers.sent_deletes import SentDeletes
from trainjob import constants as c

ORIGIN = "sweep-test"
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)


@dataclass
class Worker:
    """The parts of a connected worker the sweep reads: its client and its TrainJob cache."""

    name: str
    api: client.ApiClient
    trainjobs: Informer
    sent_deletes: SentDeletes = field(default_factory=SentDeletes)
    active: bool = True

    def cache(self, plural: str) -> Informer:
        assert plural == c.TRAINJOBS, plural
        return self.trainjobs


class Registry:
    def __init__(self, *workers: Worker):
        self.workers = list(workers)

    def snapshot(self, draining: bool = False) -> list[Worker]:
        return self.workers

    @staticmethod
    def same_cluster(first: str, second: str) -> bool:
        return first == second


def read_trainjob(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict | None:
    return read_or_none(custom.get_namespaced_custom_object, *TRAINER, namespace, c.TRAINJOBS,
                        name)


def test_a_copy_the_managers_cache_does_not_account_for_yet_stays(multicluster, namespace):
    manager, worker = multicluster.manager, multicluster["worker-1"]
    job = manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "placed", "annotations": {c.PLACEMENT_ANNOTATION: "worker-1"}},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "managedBy": c.MANAGED_BY_MULTIKUEUE},
    })
    copy = worker.custom.create_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, mirror.build_remote(job, ORIGIN, {"cpu": "1"}, 1))
    copies = Informer("worker-1/trainjobs", functools.partial(
        worker.custom.list_namespaced_custom_object, *TRAINER, namespace, c.TRAINJOBS))
    behind = Informer("manager/trainjobs", functools.partial(  # never started: lists nothing
        manager.custom.list_namespaced_custom_object, *TRAINER, namespace, c.TRAINJOBS))
    copies.start()
    try:
        eventually(lambda: [o["metadata"]["name"] for o in copies.list()],
                   lambda names: names == ["placed"],
                   expected="the worker's cache to hold the copy")
        registry = Registry(Worker("worker-1", worker.api, copies))
        metrics = DispatcherMetrics()

        def swept() -> int:
            return sweep(registry, behind, ORIGIN, metrics,
                         functools.partial(read_trainjob, manager.custom))

        assert swept() == 0, "a wanted copy was deleted on the manager cache's word"
        kept = read_trainjob(worker.custom, namespace, "placed")
        assert kept is not None and kept["metadata"]["uid"] == copy["metadata"]["uid"], (
            f"the copy of a job placed on worker-1 should stay; the worker has {kept}")

        # Once the API server says the job is gone, the same sweep removes its copy.
        manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                       "placed")
        assert swept() == 1, "the copy of a deleted manager job was not removed"
        eventually(lambda: read_trainjob(worker.custom, namespace, "placed"),
                   lambda obj: obj is None,
                   expected="the copy of the deleted manager job gone from worker-1")
    finally:
        copies.stop()
