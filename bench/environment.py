"""The clusters a run uses: a local harness (manager + workers), workers registered the
MultiKueue way with Nodes of ample capacity and the runtime, and the dispatcher process.

With ``kueue`` every cluster also runs Kueue, set up as a MultiKueue user would (a
ClusterQueue using the MultiKueue AdmissionCheck on the manager, one per worker, a
LocalQueue in every namespace the run makes), with quotas far above what a run asks for, so
quota never decides where or when a job goes."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.load import RUNTIME
from bench.timeline import TRAINJOB_RESOURCE
from clusters import fixtures, kueue, kueue_queues, processes, worker_stack
from clusters.local import LocalClusters
from clusters.nodes import NodeLayout
from clusters.testing import ServiceProcess, eventually
from controller_kit.kubeclient import api_client
from trainjob import constants as c

log = logging.getLogger(__name__)

# The dispatcher's own namespace (its Lease and worker Secrets), never Kueue's: in kueue
# mode the Secrets of the MultiKueueClusters' names there are Kueue's, which the dispatcher
# refuses to read.
DISPATCHER_NAMESPACE = "trainjob-system"
# Room for far more jobs than any run places: 3 pods of 100m cpu each per job.
NODE_CAPACITY = {"cpu": "100000", "memory": "1000Ti", "pods": "10000000"}
# Kueue quota on every ClusterQueue: more than every Node of a run together, GPUs included
# (a resource no ClusterQueue covers makes a Workload inadmissible).
KUEUE_QUOTA = {"cpu": "1000000", "memory": "10000Ti", "nvidia.com/gpu": "100000"}
# Standalone beside Kueue must label its copies with another origin than Kueue's.
STANDALONE_ORIGIN = "bench-standalone"


def release_finalizers(api: client.ApiClient, resource: tuple[str, str, str],
                       namespace: str) -> None:
    """Remove every finalizer of the ``resource`` objects in ``namespace`` that have any,
    16 at a time (an object gone meanwhile is fine)."""
    custom = client.CustomObjectsApi(api)
    group, version, plural = resource
    listed = custom.list_namespaced_custom_object(group, version, namespace, plural)
    held = [item["metadata"]["name"] for item in listed.get("items", [])
            if item["metadata"].get("finalizers")]

    def release(name: str) -> None:
        try:
            custom.patch_namespaced_custom_object(
                group, version, namespace, plural, name, {"metadata": {"finalizers": None}},
                _content_type="application/merge-patch+json", _preload_content=False)
        except ApiException as err:
            if err.status != 404:
                raise

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(release, held))


class ControllerStartError(RuntimeError):
    """A controller of a scenario did not come up; names it and its log file."""

    def __init__(self, controller: str, log_file: Path, cause: BaseException):
        why = (str(cause).strip().splitlines() or [repr(cause)])[0]
        super().__init__(f"{controller} failed to start (log: {log_file}): {why}")
        self.controller = controller
        self.log_file = log_file


class BenchClusters:
    """A manager and ``workers`` workers: started here (and removed by ``close``) or, with
    ``reuse``, clusters already running under that state directory (left running)."""

    def __init__(self, state_dir: Path, workers: int, log_dir: Path, *, reuse: bool = False,
                 kueue: bool = False, dispatcher_args: tuple[str, ...] = (),
                 kueue_integrations: tuple[str, ...] = kueue.INTEGRATIONS):
        self.harness = LocalClusters(state_dir, tied_to_caller=not reuse)
        self.workers = workers
        self.kueue = kueue
        # The job kinds every Kueue manages (Kueue's integration names): TrainJobs by
        # default; the constrained mix adds batch/job.
        self.kueue_integrations = tuple(kueue_integrations)
        self.log_dir = log_dir
        self.reuse = reuse
        self.extra_dispatcher_args = tuple(dispatcher_args)
        self.apis: dict[str, client.ApiClient] = {}
        self.dispatcher: ServiceProcess | None = None
        self.operators: list[ServiceProcess] = []
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
            extra = ({"kueue_clusters": tuple(self.names),
                      "kueue_dispatcher": kueue.DISPATCHER_ALL_AT_ONCE,
                      "kueue_integrations": self.kueue_integrations} if self.kueue else {})
            self.harness.up(workers=self.workers, timeout=300, node_layout=NodeLayout(default=[]),
                            **extra)
        for name in self.names:
            self.apis[name] = api_client(self.kubeconfig(name))
        for name in self.worker_names:
            fixtures.register_worker(self.apis["manager"], name, self.kubeconfig(name),
                                     DISPATCHER_NAMESPACE)
            fixtures.add_node(self.apis[name], f"{name}-bench", NODE_CAPACITY)
        # Kueue on the manager reads the runtime to know a job's pods.
        for name in self.names if self.kueue else self.worker_names:
            fixtures.install_runtime(self.apis[name],
                                     fixtures.torch_runtime(RUNTIME, cpu="100m", memory="128Mi"))
        if self.kueue:
            for name in self.worker_names:
                kueue_queues.cluster_queue(self.apis[name], KUEUE_QUOTA)
            kueue_queues.multikueue_manager(
                self.apis["manager"], self.config_name(self.worker_names),
                {name: self.kubeconfig(name) for name in self.worker_names}, KUEUE_QUOTA)

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
        if self.kueue:
            groups.update({"kueue manager": [], "kueue workers": []})
        for record in self.harness.load().clusters:
            for component, pid in record.pids.items():
                if component == kueue.COMPONENT:
                    if record.name == "manager" or record.name in workers:
                        groups["kueue manager" if record.name == "manager"
                               else "kueue workers"].append(pid)
                elif component == "kube-controller-manager":
                    groups["controller-managers"].append(pid)
                elif component in worker_stack.WORKER_COMPONENTS:
                    if record.name in workers:
                        groups["worker scheduler+jobset+kwok"].append(pid)
                elif record.name == "manager":
                    groups["manager apiserver+etcd"].append(pid)
                elif record.name in workers:
                    groups["workers apiserver+etcd"].append(pid)
        groups["dispatcher"] = [self.dispatcher.proc.pid] if self.dispatcher else []
        if self.operators:
            groups["training operators"] = [p.proc.pid for p in self.operators
                                            if p.proc is not None]
        groups["benchmark"] = [os.getpid()]
        return groups

    # --- namespaces --------------------------------------------------------------------

    def create_namespace(self, namespace: str, clusters: list[str] | None = None) -> None:
        for name in clusters or self.names:
            fixtures.ensure_namespace(self.apis[name], namespace)
            if self.kueue:
                kueue_queues.local_queue(self.apis[name], namespace)
        if namespace not in self.namespaces:
            self.namespaces.append(namespace)

    def remove_namespaces(self, namespaces: list[str], timeout: float = 300) -> None:
        """Delete the namespaces everywhere. Run with the dispatcher stopped: its
        finalizers are taken off here, so its remote copies go with the worker namespaces."""
        for namespace in namespaces:
            release_finalizers(self.apis["manager"], TRAINJOB_RESOURCE, namespace)
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

    @staticmethod
    def config_name(workers: list[str]) -> str:
        return f"bench-{len(workers)}"

    def dispatcher_args(self, config_name: str, placement_policy: str) -> tuple[str, ...]:
        return ("--multikueue-config", config_name, "--namespace", DISPATCHER_NAMESPACE,
                "--placement-policy", placement_policy)

    def start_dispatcher(self, workers: list[str], placement_policy: str,
                         extra_args: tuple[str, ...] = ()) -> ServiceProcess:
        """The dispatcher with a MultiKueueConfig of ``workers`` (and ``extra_args``), ready
        and every one of them Active; a ``ControllerStartError`` if it does not come up."""
        self.stop_dispatcher()
        config_name = self.config_name(workers)
        fixtures.register_config(self.apis["manager"], config_name, workers)
        self._dispatcher_runs += 1
        log_file = self.log_dir / f"dispatcher-{self._dispatcher_runs}-{config_name}.log"
        process = ServiceProcess("dispatcher", self.kubeconfig("manager"), log_file,
                                 (*self.dispatcher_args(config_name, placement_policy),
                                  *extra_args, *self.extra_dispatcher_args))
        try:
            self.dispatcher = process.start()
        except (AssertionError, OSError) as err:
            process.stop(kill=True)
            raise ControllerStartError("dispatcher", log_file, err) from err
        custom = client.CustomObjectsApi(self.apis["manager"])

        def active(name: str) -> bool:
            obj = custom.get_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                   c.MULTIKUEUECLUSTERS, name)
            return any(x.get("type") == "Active" and x.get("status") == "True"
                       for x in (obj.get("status") or {}).get("conditions") or [])

        for name in workers:
            eventually(lambda n=name: active(n), bool, timeout=60, interval=0.2,
                       expected=f"MultiKueueCluster {name} Active=True")
        # Its start ends with one full collection of the caches (0.1 s of CPU and more):
        # done before a scenario measures it.
        eventually(self.dispatcher.started, bool, timeout=60, interval=0.1,
                   expected=f"the dispatcher to log that it runs (log: {log_file})")
        return self.dispatcher

    def use_kueue_dispatcher(self, dispatcher: str) -> None:
        """The manager's Kueue restarted with MultiKueue ``dispatcherName`` ``dispatcher``
        (unless it runs with it already)."""
        record = next(r for r in self.harness.load().clusters if r.name == "manager")
        if record.kueue_dispatcher == dispatcher:
            return
        log_file = self.control_plane("manager").log_file(kueue.COMPONENT)
        try:
            self.harness.use_kueue_dispatcher("manager", dispatcher, timeout=120)
        except Exception as err:  # reported as the controller that failed
            raise ControllerStartError(f"Kueue on the manager ({dispatcher})", log_file,
                                       err) from err

    def start_operators(self, workers: list[str], namespace: str | None = None,
                        log_name: str = "operator") -> None:
        """A training operator on each of ``workers``, ready (reconciling only
        ``namespace`` when given); a ``ControllerStartError`` names one that does not come
        up (those already started are stopped by ``stop_operators`` or ``close``)."""
        for worker in workers:
            log_file = self.log_dir / f"{log_name}-{worker}.log"
            process = ServiceProcess(
                "training_operator", self.kubeconfig(worker), log_file,
                ("--cluster-name", worker, *(("--namespace", namespace) if namespace
                                             else ())))
            try:
                process.start()
            except (AssertionError, OSError) as err:
                process.stop(kill=True)
                raise ControllerStartError(f"training operator on {worker}", log_file,
                                           err) from err
            self.operators.append(process)

    def stop_operators(self) -> None:
        for process in self.operators:
            process.stop()
        self.operators = []

    def restart_kueues(self) -> None:
        """Every cluster's Kueue restarted with its settings: none of the work it had
        queued in memory is left (Kueue calls the workers through 5-qps clients, so a
        backlog of deletions outlasts the objects themselves)."""
        for name in self.names:
            log_file = self.control_plane(name).log_file(kueue.COMPONENT)
            try:
                self.harness.restart_kueue(name, timeout=120)
            except Exception as err:  # reported as the controller that failed
                raise ControllerStartError(f"Kueue on {name}", log_file, err) from err

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
        """Stop the dispatcher and operators; remove the clusters, or (reused clusters)
        what the run put into them."""
        self.stop_dispatcher()
        self.stop_operators()
        try:
            if self.reuse and self.apis:
                self.remove_namespaces(list(self.namespaces))
                self._unregister()
        finally:
            for api in self.apis.values():
                api.close()
            if not self.reuse:
                self.harness.down()


def dispatcher_configuration(env: BenchClusters, workers: int, placement_policy: str) -> dict:
    """Every setting the dispatcher ran with: its flags and the resulting configuration."""
    from dispatcher.cli import build_parser
    from dispatcher.config import load_config

    args = env.dispatcher_args(env.config_name(env.worker_names[:workers]), placement_policy)
    parsed = build_parser().parse_args(["run", *args])
    config = load_config(None, {"namespace": parsed.namespace,
                                "multikueue_config": parsed.multikueue_config,
                                "placement_policy": parsed.placement_policy})
    return {"flags": list(args), "reconcile_workers": parsed.workers,
            "config": config.model_dump(mode="json")}


def source_revision() -> dict | None:
    """The project's commit and whether the files differ from it (None outside a git
    checkout): runs are compared across changes of the code, and must say which they ran."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "local_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


def describe(env: BenchClusters, settings) -> dict:
    """The machine, the clusters' Kubernetes, the project's revision and the dispatcher's
    configuration."""
    return {
        "source": source_revision(),
        "kubernetes": env.kubernetes_version(),
        "cpu_count": os.cpu_count(),
        # What its clusters' Go servers run with; clusters it reuses were started by
        # someone else's `up`, with settings it cannot know.
        "go_runtime": None if env.reuse else processes.go_runtime_env(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "clusters": len(env.names),
        "dispatcher": dispatcher_configuration(env, settings.burst_workers,
                                               settings.placement_policy),
    }
