"""Mixed workers: the dispatcher on the manager, this project's operator on worker-1 and
upstream Kubeflow Trainer v2.3.0's controller (with upstream's CRDs and webhooks) on
worker-2. Jobs dispatched from the manager run to Complete on both kinds of worker: the copy
on worker-2 is built by upstream's controller, and its status comes back to the manager."""

from __future__ import annotations

import pytest

from clusters import crds, fixtures, upstream_trainer
from clusters.testing import ServiceProcess, eventually
from clusters.trainer_controller import TrainerController
from trainjob import constants as c

from dispatch_helpers import condition, create, get, placement

CONFIG = "mixed"
RUNTIME = "torch-distributed"


@pytest.fixture
def mixed_workers(multicluster, namespace, tmp_path):
    """Worker-1 with the operator, worker-2 with upstream's controller, the dispatcher on the
    manager over both; each worker one kwok Node with room for one 1-cpu job at a time."""
    manager = multicluster.manager
    ours, theirs = multicluster["worker-1"], multicluster["worker-2"]
    before = multicluster.harness.use_trainer_crds(theirs.name, crds.UPSTREAM)
    cleanups = [lambda: multicluster.harness.use_trainer_crds(theirs.name, before)]
    try:
        # Upstream's shipped torch runtime, namespaced so that it is this test's own.
        runtime = {**upstream_trainer.runtime("torch_distributed.yaml"),
                   "kind": c.TRAININGRUNTIME_KIND,
                   "metadata": {"name": RUNTIME, "namespace": namespace}}
        for worker in (ours, theirs):
            node = f"{namespace}-{worker.name}"
            fixtures.add_node(worker.api, node, {"cpu": "1500m", "memory": "8Gi"})
            cleanups.append(lambda api=worker.api, node=node: fixtures.remove_node(api, node))
            fixtures.install_runtime(worker.api, runtime)
            fixtures.register_worker(manager.api, f"mixed-{worker.name}", worker.kubeconfig)
            cleanups.append(lambda name=f"mixed-{worker.name}": manager.custom
                            .delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                          c.MULTIKUEUECLUSTERS, name))
        fixtures.register_config(manager.api, CONFIG, [f"mixed-{ours.name}",
                                                       f"mixed-{theirs.name}"])
        cleanups.append(lambda: manager.custom.delete_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECONFIGS, CONFIG))
        trainer = TrainerController(multicluster.harness, theirs.name).start()
        cleanups.append(trainer.stop)
        operator = ServiceProcess("training_operator", ours.kubeconfig,
                                  tmp_path / "operator.log", ("--namespace", namespace)).start()
        cleanups.append(operator.stop)
        dispatcher = ServiceProcess("dispatcher", manager.kubeconfig, tmp_path / "dispatcher.log",
                                    ("--multikueue-config", CONFIG)).start()
        cleanups.append(dispatcher.stop)
        yield {"manager": manager, "ours": ours, "theirs": theirs}
    finally:
        for cleanup in reversed(cleanups):
            cleanup()


def _job(name: str) -> dict:
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name},
            "spec": {"managedBy": c.MANAGED_BY_MULTIKUEUE,
                     "runtimeRef": {"name": RUNTIME, "kind": c.TRAININGRUNTIME_KIND},
                     "trainer": {"numNodes": 1, "command": ["torchrun", "train.py"],
                                 "resourcesPerNode": {"requests": {"cpu": "1"}}}}}


def test_jobs_run_to_complete_on_an_operator_worker_and_an_upstream_trainer_worker(
        mixed_workers, namespace):
    manager = mixed_workers["manager"]
    names = ("first", "second")
    for name in names:
        create(manager, namespace, _job(name))
    # One 1-cpu job fits on each worker at a time: the two go to different workers.
    placed = eventually(lambda: {n: placement(get(manager, namespace, n)) for n in names},
                        lambda seen: all(seen.values()),
                        expected="both manager TrainJobs placed", timeout=60)
    assert sorted(placed.values()) == ["mixed-worker-1", "mixed-worker-2"], (
        f"expected one job on each worker, saw {placed}")
    theirs = next(n for n, w in placed.items() if w == "mixed-worker-2")
    # Placement is written before the copy is created: wait for the copy.
    copy = eventually(lambda: get(mixed_workers["theirs"], namespace, theirs),
                      lambda obj: obj is not None, expected=f"the copy of {theirs} on worker-2")
    assert copy["spec"].get("managedBy") == c.MANAGED_BY_TRAINER_CONTROLLER, (
        f"expected upstream's CRD to default the copy's managedBy to "
        f"{c.MANAGED_BY_TRAINER_CONTROLLER}, saw {copy['spec'].get('managedBy')!r}")

    for name in names:
        done = eventually(lambda n=name: get(manager, namespace, n),
                          lambda obj: (condition(obj, c.CONDITION_COMPLETE) or {}).get(
                              "status") == "True",
                          expected=f"manager TrainJob {name} (on {placed[name]}) Complete",
                          timeout=120)
        assert [(j["name"], j["succeeded"]) for j in done["status"]["jobsStatus"]] == [
            ("node", 1)], done["status"]
