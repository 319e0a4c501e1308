"""The dispatcher end to end: manager + 2 workers, the training operator on each worker,
the dispatcher on the manager, workers registered the MultiKueue way.

Capacity: worker-1 has 16 cpu and worker-2 64 cpu (plus memory) on one kwok Node each. Tests
that need to control capacity exactly use an extended resource or a Node label of their own
(e.g. ``example.com/<test>``) on Nodes they add and remove, so tests do not disturb each other.

Pods are real: the JobSet controller, job controller and scheduler run on each worker and
kwok runs the pods. Pods of ``RUNTIME`` run until deleted, so a job stays running as long as a
test needs; pods of ``QUICK_RUNTIME`` succeed a second after they start.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from kubernetes import client

from clusters import fixtures, worker_stack
from clusters.testing import ServiceProcess, eventually
from trainjob import constants as c

from dispatch_helpers import (
    CONFIG,
    PYTHON_GC_SWEEP_SECONDS,
    QUICK_RUNTIME,
    RUNTIME,
    worker_lost_timeout,
)

# Short lease timings: a SIGKILLed dispatcher's successor takes over within seconds.
LEASE_ARGS = ("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")


@dataclass
class DispatchEnv:
    multicluster: object
    dispatcher: ServiceProcess
    operators: dict[str, ServiceProcess]
    log_dir: object
    worker_lost_timeout: int
    restarts: int = 0

    @property
    def manager(self):
        return self.multicluster.manager

    def restart_dispatcher(self, kill: bool = True) -> ServiceProcess:
        self.restarts += 1
        self.dispatcher.stop(kill=kill)
        self.dispatcher = ServiceProcess(
            "dispatcher", self.manager.kubeconfig,
            self.log_dir / f"dispatcher-{self.restarts}.log", self.dispatcher.extra_args,
            supervised=True)
        return self.dispatcher.start()


@pytest.fixture(scope="module")
def dispatch_env(multicluster, tmp_path_factory, request):
    """A module's ``DISPATCHER_ARGS`` are given to its dispatcher too (e.g. a retention of
    finished copies other than the default)."""
    log_dir = tmp_path_factory.mktemp("dispatch-logs")
    manager = multicluster.manager
    for worker, cpu in (("worker-1", "16"), ("worker-2", "64")):
        fixtures.register_worker(manager.api, worker, multicluster[worker].kubeconfig)
        fixtures.add_node(multicluster[worker].api, f"{worker}-base",
                          {"cpu": cpu, "memory": "512Gi", "pods": "500"})
        fixtures.install_runtime(multicluster[worker].api, fixtures.torch_runtime(
            RUNTIME, cpu="100m", memory="128Mi",
            pod_annotations={worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER}))
        fixtures.install_runtime(multicluster[worker].api, fixtures.torch_runtime(
            QUICK_RUNTIME, cpu="100m", memory="128Mi",
            pod_annotations={worker_stack.RUN_FOR_ANNOTATION: "1s"}))
    fixtures.register_config(manager.api, CONFIG, ["worker-1", "worker-2"])
    # Frequent sweeps of the interpreter's frozen objects (every test here runs beside
    # them; test_dispatch checks they come).
    sweeps = ("--python-gc-sweep-interval", str(PYTHON_GC_SWEEP_SECONDS))
    operators = {
        name: ServiceProcess("training_operator", multicluster[name].kubeconfig,
                             log_dir / f"operator-{name}.log", sweeps).start()
        for name in ("worker-1", "worker-2")
    }
    # Short fault timings so worker-loss tests run in seconds; the frequent garbage
    # collection also runs under every other test here, which must not disturb them.
    lost_timeout = worker_lost_timeout()
    dispatcher = ServiceProcess("dispatcher", manager.kubeconfig, log_dir / "dispatcher.log",
                                (*sweeps, "--multikueue-config", CONFIG, "--gc-interval", "2",
                                 # Where tests put kubeconfigs named by Path: the harness's
                                 # state and the tests' own temporary files.
                                 "--kubeconfig-dir", str(tmp_path_factory.getbasetemp()),
                                 "--kubeconfig-dir", str(multicluster.harness.state_dir),
                                 "--worker-lost-timeout", str(lost_timeout),
                                 *LEASE_ARGS, "--log-level", "debug",
                                 *getattr(request.module, "DISPATCHER_ARGS", ())),
                                # Restarted after a lost Lease, as its Deployment would: the
                                # short Lease above can miss a renewal on a loaded machine.
                                supervised=True).start()
    env = DispatchEnv(multicluster, dispatcher, operators, log_dir, lost_timeout)
    yield env
    try:
        # Namespaces deleted by the module's last fixtures still hold jobs with our
        # finalizer: let this dispatcher release them, so no later module's dispatcher
        # inherits them.
        custom = client.CustomObjectsApi(manager.api)
        eventually(lambda: [f"{j['metadata']['namespace']}/{j['metadata']['name']}"
                            for j in custom.list_cluster_custom_object(
                                c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS)["items"]
                            if c.DISPATCH_FINALIZER in (j["metadata"].get("finalizers") or [])
                            and j["metadata"].get("deletionTimestamp")],
                   lambda left: not left, timeout=60,
                   expected="every deleted manager TrainJob released by the dispatcher")
    finally:
        # Whatever happened: a process left running here would act on the shared clusters
        # under every later module (an operator reconciling their TrainJobs).
        env.dispatcher.stop()
        for process in env.operators.values():
            process.stop()
        custom = client.CustomObjectsApi(manager.api)
        for name in ("worker-1", "worker-2"):
            custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                "multikueueclusters", name)
            client.CoreV1Api(multicluster[name].api).delete_node(f"{name}-base")
        custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "multikueueconfigs",
                                            CONFIG)
