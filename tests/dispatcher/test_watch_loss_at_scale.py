"""A worker the size of a real GPU cluster (1,000 kwok Nodes, 20,000 Pods, its Pods
churning) whose apiserver restarts under the dispatcher: every watch of it drops, and the
history they would resume from goes with the apiserver's watch cache.

* the dispatcher lists the worker's Nodes and Pods again, and its room then matches what
  the worker holds (the capacity gauges against the Pods listed from the apiserver);
* room taken right after the restart, while the dispatcher's picture was the one from
  before, is never given to a job: a GPU job that only that old picture had room for
  waits, and is placed once room really frees.

On clusters of its own (a manager and one worker, started for this module); `make
test-scale` runs it (about five minutes on two cores, most of it filling the worker).
"""

from __future__ import annotations

import dataclasses
import json
import time
from decimal import Decimal

import pytest
from kubernetes import client
from kubernetes.utils.quantity import parse_quantity

from bench import scale
from bench.environment import BenchClusters
from bench.load import LoadRunner
from clusters import fixtures
from clusters.testing import eventually, holds_for
from controller_kit.kubeclient import api_client
from trainjob import constants as c

NODES, PODS = 1000, 20_000
CHURN_PER_SECOND = 50
WORKER = "worker-1"
NAMESPACE = "watch-loss"
GPU = "nvidia.com/gpu"
pytestmark = [pytest.mark.scale, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def fleet_env(tmp_path_factory):
    """The clusters, the worker filled (every Pod Running), and the dispatcher started."""
    base = tmp_path_factory.mktemp("watch-loss")
    env = BenchClusters(base / "state", 1, base)
    started = time.monotonic()
    try:
        env.up()
        fleet = scale.build_fleet(WORKER, NODES, PODS)
        fixtures.install_runtime(env.apis[WORKER], scale.runtime())
        # Bound is what counts for room: kwok marks them Running meanwhile.
        scale.populate(env, [fleet], threads=16, wait_running=False)
        print(f"fleet of {NODES} Nodes and {PODS} Pods bound in "
              f"{time.monotonic() - started:.0f} s")
        for name in env.names:
            fixtures.ensure_namespace(env.apis[name], NAMESPACE)
        env.start_dispatcher([WORKER], "worst-fit")
        yield env, fleet
    finally:
        env.close()


def used_on_worker(api: client.ApiClient) -> dict[str, Decimal]:
    """cpu (cores) and GPUs that the worker's bound, unfinished Pods request, listed from
    its apiserver."""
    total = {"cpu": Decimal(0), GPU: Decimal(0)}
    token = None
    core = client.CoreV1Api(api)
    while True:
        page = core.list_pod_for_all_namespaces(
            limit=2000, _continue=token,
            field_selector="status.phase!=Succeeded,status.phase!=Failed")
        for pod in page.items:
            if not pod.spec.node_name:
                continue
            for container in pod.spec.containers:
                requests = (container.resources.requests or {}) if container.resources else {}
                limits = (container.resources.limits or {}) if container.resources else {}
                for resource in total:
                    amount = requests.get(resource, limits.get(resource))
                    if amount is not None:
                        total[resource] += parse_quantity(amount)
        token = page.metadata._continue
        if not token:
            return total


def used_by_dispatcher(env) -> dict[str, Decimal]:
    return {resource: Decimal(str(env.dispatcher.metric(
        "dispatcher_worker_capacity", cluster=WORKER, resource=resource, state="used")))
        for resource in ("cpu", GPU)}


def gpu_job(name: str) -> dict:
    """A TrainJob of one pod that takes a whole GPU Node (8 GPUs)."""
    return scale.job_body(name, "gpu", {"gpu": {"pods": 1, "cpu": "4", "memory": "16Gi",
                                                "gpus": 8}}, namespace=NAMESPACE)


def placed_on(manager: client.ApiClient, name: str) -> str | None:
    job = client.CustomObjectsApi(manager).get_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, NAMESPACE, c.TRAINJOBS, name)
    return (job["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)


def test_a_lost_watch_during_churn_leaves_no_placement_on_room_that_is_gone(fleet_env):
    env, fleet = fleet_env
    worker_api = env.apis[WORKER]
    eventually(lambda: used_by_dispatcher(env), lambda used: used == used_on_worker(worker_api),
               timeout=120, interval=2,
               expected="the dispatcher's used room equal to the worker's Pods before the "
                        "restart")
    free_gpu_nodes = [node for node in fleet.nodes if node.pool == "gpu" and node.used_gpus == 0]
    assert free_gpu_nodes, "the fleet leaves whole GPU Nodes free"
    # The churn replaces CPU Pods only: a GPU Pod replaced would free its GPUs for a moment,
    # and the job below could rightly take them.
    cpu_only = dataclasses.replace(fleet, pods=[
        pod for pod in fleet.pods if GPU not in json.dumps(pod["spec"])])
    churn = scale.Churn(env.kubeconfig(WORKER), cpu_only, CHURN_PER_SECOND).start()
    log_offset = env.dispatcher.log_file.stat().st_size
    try:
        env.harness.stop(WORKER)
        env.harness.start(WORKER, timeout=300)
        # Right away, while the dispatcher's picture is the one from before the restart:
        # every whole GPU Node taken, then a job that needs one.
        hogs = [scale.gpu_hog(node, f"hog-{index}") for index, node in enumerate(free_gpu_nodes)]
        runner = LoadRunner(16)
        try:
            runner.run([(env.kubeconfig(WORKER), scale.create_pod_call(body)) for body in hogs])
        finally:
            runner.close()
        listed = client.CoreV1Api(worker_api).list_namespaced_pod(
            scale.WORK_NAMESPACE, label_selector="app=gpu-hog")
        assert len(listed.items) == len(hogs), (
            f"expected {len(hogs)} GPU-hog Pods on the worker, found {len(listed.items)}")
        with api_client(env.kubeconfig("manager")) as manager:
            client.CustomObjectsApi(manager).create_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, NAMESPACE, c.TRAINJOBS, gpu_job("gpu-job"))
            holds_for(lambda: placed_on(manager, "gpu-job"), lambda placed: placed is None,
                      seconds=20, expected="the GPU job not placed: every whole GPU Node was "
                                           "taken right after the restart")
    finally:
        churned = churn.stop()
    print("churn:", churned)
    relisted = env.dispatcher.log_file.read_text()[log_offset:]
    assert f"{WORKER}/pods: watch history expired or watch lost; relisting" in relisted, (
        "expected the worker's Pods listed again after the restart; log: "
        + env.dispatcher.log_tail(40))
    eventually(lambda: used_by_dispatcher(env), lambda used: used == used_on_worker(worker_api),
               timeout=120, interval=2,
               expected="the dispatcher's used room equal to the worker's Pods after the "
                        "restart and the churn")
    # Room really frees: the job goes there.
    freed = hogs[0]["metadata"]
    client.CoreV1Api(worker_api).delete_namespaced_pod(freed["name"], freed["namespace"],
                                                        grace_period_seconds=0)
    with api_client(env.kubeconfig("manager")) as manager:
        eventually(lambda: placed_on(manager, "gpu-job"), lambda placed: placed == WORKER,
                   timeout=60, expected="the GPU job placed once a GPU Node was freed")
