"""The clusters a run uses: a local harness (manager + workers), workers registered the
MultiKueue way with Nodes of ample capacity and the runtime, and the dispatcher process."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.load import RUNTIME
from clusters import fixtures, worker_stack
from clusters.local import LocalClusters
from clusters.nodes import NodeLayout
from clusters.testing import ServiceProcess, eventually
from trainjob import constants as c
from trainjob.kubeclient import api_client

log = logging.getLogger(__name__)

DISPATCHER_NAMESPACE = "kueue-system"
# Room for far more jobs than any run places: 3 pods of 100m cpu each per job.
NODE_CAPACITY = {"cpu": "100000", "memory": "1000Ti", "pods": "10000000"}


class BenchClusters:
    """A manager and ``workers`` workers: started here (and removed by ``close``) or, with
    ``reuse``, clusters already running under that state directory (left running)."""

    def __init__(self, state_dir: Path, workers: int, log_dir: Path, *, reuse: bool = False):
        self.harness = LocalClusters(state_dir, tied_to_caller=not reuse)
        self.workers = workers
        self.log_dir = log_dir
        self.reuse = reuse
        self.apis: dict[str, client.ApiClient] = {}
        self.dispatcher: ServiceProcess | None = None
        self.namespaces: list[str] = []
        self._dispatcher_runs = 0

    # --- clusters ----------------------------------------------------------------------

    def up(self) -> None:
        if self.reuse:
            state = self.harness.load()
            have = [r.name for r in state.clusters if r.role == "worker"]
            if len(have) < self.workers:
                raise RuntimeError(f"{self.harness.state_dir} holds {len(have)} workers; this "
                                   f"run needs {self.workers}")
        else:
            # No default Nodes: the benchmark adds one Node of ample capacity per worker.
            self.harness.up(workers=self.workers, timeout=300, node_layout=NodeLayout(default=[]))
        for name in self.names:
            self.apis[name] = api_client(self.kubeconfig(name))
        for name in self.worker_names:
            fixtures.register_worker(self.apis["manager"], name, self.kubeconfig(name),
                                     DISPATCHER_NAMESPACE)
            fixtures.add_node(self.apis[name], f"{name}-bench", NODE_CAPACITY)
            fixtures.install_runtime(self.apis[name],
                                     fixtures.torch_runtime(RUNTIME, cpu="100m", memory="128Mi"))

    @property
    def names(self) -> list[str]:
        return ["manager"] + self.worker_names

    @property
    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.workers + 1)]

    def kubeconfig(self, name: str) -> Path:
        return self.harness.kubeconfig(name)

    def control_plane(self, name: str):
        state = self.harness.load()
        return self.harness.control_plane(next(r for r in state.clusters if r.name == name))

    def kubernetes_version(self) -> dict:
        status, body = self.control_plane("manager").get("/version", timeout=10)
        if status != 200:
            raise RuntimeError(f"manager /version answered {status}: {body[:200]}")
        return json.loads(body)

    def process_groups(self, workers: list[str]) -> dict[str, list[int]]:
        """PIDs by role, for CPU accounting: the manager's control plane, the workers' in
        use, the controller-managers, the dispatcher and this benchmark process."""
        import os

        groups: dict[str, list[int]] = {"manager apiserver+etcd": [],
                                        "workers apiserver+etcd": [],
                                        "controller-managers": [],
                                        "worker scheduler+jobset+kwok": []}
        for record in self.harness.load().clusters:
            for component, pid in record.pids.items():
                if component == "kube-controller-manager":
                    groups["controller-managers"].append(pid)
                elif component in worker_stack.WORKER_COMPONENTS:
                    if record.name in workers:
                        groups["worker scheduler+jobset+kwok"].append(pid)
                elif record.name == "manager":
                    groups["manager apiserver+etcd"].append(pid)
                elif record.name in workers:
                    groups["workers apiserver+etcd"].append(pid)
        groups["dispatcher"] = [self.dispatcher.proc.pid] if self.dispatcher else []
        groups["benchmark"] = [os.getpid()]
        return groups

    # --- namespaces --------------------------------------------------------------------

    def create_namespace(self, namespace: str, clusters: list[str] | None = None) -> None:
        for name in clusters or self.names:
            fixtures.ensure_namespace(self.apis[name], namespace)
        if namespace not in self.namespaces:
            self.namespaces.append(namespace)

    def remove_namespaces(self, namespaces: list[str], timeout: float = 300) -> None:
        """Delete the namespaces everywhere. Run with the dispatcher stopped: its
        finalizers are taken off here, so its remote copies go with the worker namespaces."""
        custom = client.CustomObjectsApi(self.apis["manager"])

        def release(namespace: str, name: str) -> None:
            try:
                custom.patch_namespaced_custom_object(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name,
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json")
            except ApiException as err:
                if err.status != 404:
                    raise

        with ThreadPoolExecutor(16) as pool:
            for namespace in namespaces:
                listed = custom.list_namespaced_custom_object(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS)
                held = [i["metadata"]["name"] for i in listed.get("items", [])
                        if i["metadata"].get("finalizers")]
                list(pool.map(lambda n, ns=namespace: release(ns, n), held))
        for namespace in namespaces:
            for name in self.names:
                try:
                    client.CoreV1Api(self.apis[name]).delete_namespace(namespace)
                except ApiException as err:
                    if err.status != 404:
                        raise
        for namespace in namespaces:
            for name in self.names:
                core = client.CoreV1Api(self.apis[name])
                eventually(lambda: [n.metadata.name for n in core.list_namespace().items],
                           lambda names, ns=namespace: ns not in names, timeout=timeout,
                           interval=0.5,
                           expected=f"namespace {namespace} gone from cluster {name}")
            if namespace in self.namespaces:
                self.namespaces.remove(namespace)

    # --- the dispatcher ----------------------------------------------------------------

    def dispatcher_args(self, config_name: str, placement_policy: str) -> tuple[str, ...]:
        return ("--multikueue-config", config_name, "--namespace", DISPATCHER_NAMESPACE,
                "--placement-policy", placement_policy)

    def start_dispatcher(self, workers: list[str], placement_policy: str) -> ServiceProcess:
        """The dispatcher with a MultiKueueConfig of ``workers``, ready and every one of
        them Active."""
        self.stop_dispatcher()
        config_name = f"bench-{len(workers)}"
        fixtures.register_config(self.apis["manager"], config_name, workers)
        self._dispatcher_runs += 1
        self.dispatcher = ServiceProcess(
            "dispatcher", self.kubeconfig("manager"),
            self.log_dir / f"dispatcher-{self._dispatcher_runs}-{config_name}.log",
            self.dispatcher_args(config_name, placement_policy)).start()
        custom = client.CustomObjectsApi(self.apis["manager"])

        def active(name: str) -> bool:
            obj = custom.get_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                   c.MULTIKUEUECLUSTERS, name)
            return any(x.get("type") == "Active" and x.get("status") == "True"
                       for x in (obj.get("status") or {}).get("conditions") or [])

        for name in workers:
            eventually(lambda n=name: active(n), bool, timeout=60, interval=0.2,
                       expected=f"MultiKueueCluster {name} Active=True")
        return self.dispatcher

    def stop_dispatcher(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher = None

    def _unregister(self) -> None:
        """Take back from reused clusters what ``up`` and the runs added (the huge Nodes
        would change every later placement there)."""
        custom = client.CustomObjectsApi(self.apis["manager"])
        gone = (404,)
        for name in self.worker_names:
            for delete in (
                lambda: client.CoreV1Api(self.apis[name]).delete_node(f"{name}-bench"),
                lambda: client.CustomObjectsApi(self.apis[name]).delete_cluster_custom_object(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, c.CLUSTERTRAININGRUNTIMES, RUNTIME),
                lambda: custom.delete_cluster_custom_object(
                    c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, name),
            ):
                try:
                    delete()
                except ApiException as err:
                    if err.status not in gone:
                        raise
        for count in range(1, self.workers + 1):
            try:
                custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                    c.MULTIKUEUECONFIGS, f"bench-{count}")
            except ApiException as err:
                if err.status not in gone:
                    raise

    # --- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the dispatcher; remove the clusters, or (reused clusters) what the run
        put into them."""
        self.stop_dispatcher()
        try:
            if self.reuse and self.apis:
                self.remove_namespaces(list(self.namespaces))
                self._unregister()
        finally:
            for api in self.apis.values():
                api.close()
            if not self.reuse:
                self.harness.down()
