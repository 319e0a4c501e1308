"""Constrained placement: workers of different sizes and jobs of mixed sizes, some with
GPUs, that fit in aggregate but not everywhere. The jobs really run (the training operator
on each worker, the JobSet controller, kube-scheduler, kwok pods that end after a few
seconds; each job's trainer after its dataset and model initializers, as upstream Trainer's
runtimes order them), so the figures say how well placement used the Nodes:

* pods stuck Pending as unschedulable (the scheduler's PodScheduled=False, Unschedulable);
* remote copies created and then withdrawn before their job finished;
* makespan: the first create to the last job Complete on the manager;
* mean Node utilisation (cpu and GPUs requested by running pods over what the pool's Nodes
  allocate) while jobs run.

The pool's Nodes carry a label of their own and the jobs' runtimes select it, so the
benchmark's large default Nodes take no part. Submitting the jobs is a parameter: the
standalone dispatcher gets ``managedBy: kueue.x-k8s.io/multikueue``; other dispatchers can
get their own labels on the same workload.

The workload can be a mix of kinds (``kinds``): some jobs TrainJobs, others batch/v1 Jobs
of the same trainer pods (count, requests, run time, Node selector; no initializers, a
Job has none), which only a dispatcher behind Kueue takes (Kueue's ``batch/job``
integration on every cluster: the manager's Job is Kueue's, ``managedBy``
``kueue.x-k8s.io/multikueue``, and the manager runs no job controller; the worker's copy
runs on its kwok Nodes through its job controller, and Kueue copies its status back, so a
batch Job is finished when the manager's Job has ``Complete``). The figures are given for
the whole mix and for each kind.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity

from bench.load import create_call
from bench.stats import summary_ms
from bench.timeline import TrainJobTimeline
from clusters import fixtures, worker_stack
from trainjob import constants as c

log = logging.getLogger(__name__)

POOL_LABEL = "bench.trainjob-dispatcher.io/pool"
POOL = "constrained"
GPU = "nvidia.com/gpu"
# Two run times, so jobs finish out of order and room opens up while others wait.
RUN_TIMES = {"bench-constrained-short": "4s", "bench-constrained-long": "9s"}
# The initializers that come before each trainer: a moment, so the trainers' run times rule.
INITIALIZER_RUN_FOR = "1s"
# Node sizes per worker, in worker order: small cpu-only, mid with GPUs, one large Node.
# 80 cpu and 8 GPUs in all; no single worker can take every job.
POOL_NODES = [
    [{"cpu": "8"}, {"cpu": "8"}],
    [{"cpu": "16", GPU: "4"}, {"cpu": "16", GPU: "4"}],
    [{"cpu": "32"}],
]
NODE_BASE = {"memory": "256Gi", "pods": "110"}
POLL_SECONDS = 0.25

Submit = Callable[[dict], dict]  # job body (TrainJob or batch Job) -> the body as submitted

# The kinds a constrained job can be submitted as.
TRAINJOB = "trainjob"
BATCH_JOB = "batch-job"
KINDS = (TRAINJOB, BATCH_JOB)
# The batch Jobs' own resource, read and written through the generic API paths.
BATCH_JOB_RESOURCE = ("batch", "v1", "jobs")
# A pod of a batch Job names its Job here (a JobSet's pods name their JobSet apart).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


@dataclass(frozen=True)
class Job:
    name: str
    nodes: int
    cpu: int
    gpus: int
    runtime: str
    kind: str = TRAINJOB

    def resources(self) -> dict[str, dict[str, str]]:
        """What each trainer pod requests."""
        resources: dict[str, dict[str, str]] = {"requests": {"cpu": str(self.cpu),
                                                             "memory": "1Gi"}}
        if self.gpus:
            # GPUs cannot be overcommitted: the API requires the limit, equal to the request.
            resources["requests"][GPU] = str(self.gpus)
            resources["limits"] = {GPU: str(self.gpus)}
        return resources

    def body(self) -> dict:
        if self.kind == BATCH_JOB:
            return self.batch_body()
        return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
                "metadata": {"name": self.name},
                "spec": {"runtimeRef": {"name": self.runtime},
                         "trainer": {"numNodes": self.nodes,
                                     "resourcesPerNode": self.resources()}}}

    def batch_body(self) -> dict:
        """The same trainer pods as a batch/v1 Job: ``nodes`` pods at once, each with the
        TrainJob's per-node requests, on the pool's Nodes, for its runtime's run time."""
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": self.name},
                "spec": {"parallelism": self.nodes, "completions": self.nodes,
                         "backoffLimit": 0, "template": {
                             "metadata": {"annotations": {
                                 worker_stack.RUN_FOR_ANNOTATION: RUN_TIMES[self.runtime]}},
                             "spec": {"restartPolicy": "Never",
                                      # As the runtimes' pods: nothing for kwok to stop.
                                      "terminationGracePeriodSeconds": 0,
                                      "nodeSelector": {POOL_LABEL: POOL},
                                      "containers": [{"name": c.NODE, "image": "busybox",
                                                      "resources": self.resources()}]}}}}


def standalone(body: dict) -> dict:
    """How jobs reach this dispatcher on its own."""
    body["spec"]["managedBy"] = c.MANAGED_BY_MULTIKUEUE
    return body


def workload(count: int, seed: int = 7, kinds: tuple[str, ...] = (TRAINJOB,)) -> list[Job]:
    """``count`` jobs, the same for every run with the same seed: a quarter want GPUs
    (which only one worker has), the rest 2-12 cpu per node on one or two nodes.

    ``kinds``: what each job is submitted as, in turn, shifted by one every four jobs so
    that the GPU jobs (every fourth) alternate between the kinds too (with a TrainJob and
    a batch Job: T B T B, B T B T, ...). The sizes do not depend on the kinds."""
    unknown = sorted(set(kinds) - set(KINDS))
    if not kinds or unknown:
        raise ValueError(f"constrained job kinds {list(kinds)}: expected some of {KINDS}")
    rng = random.Random(seed)
    jobs = []
    runtimes = sorted(RUN_TIMES)
    for index in range(count):
        gpus = rng.choice((1, 2)) if index % 4 == 3 else 0
        jobs.append(Job(name=f"mixed-{index:03d}", nodes=rng.choice((1, 1, 2)),
                        cpu=rng.choice((2, 4, 6, 8, 12)) if not gpus else rng.choice((2, 4)),
                        gpus=gpus, runtime=rng.choice(runtimes),
                        kind=kinds[(index + index // 4) % len(kinds)]))
    return jobs


def create_batch_job_call(namespace: str, body: dict):
    """A create of a batch Job, for the load runner (whose clients are CustomObjectsApi:
    the generic path /apis/batch/v1/namespaces/NS/jobs is the Job API's own)."""
    def call(custom: client.CustomObjectsApi) -> object:
        return custom.create_namespaced_custom_object(*BATCH_JOB_RESOURCE[:2], namespace,
                                                      BATCH_JOB_RESOURCE[2], body,
                                                      _preload_content=False)
    return call


@dataclass
class _PoolWatch:
    """Polls the namespace's pods on each worker: which were ever unschedulable, and what
    the running ones request of the pool's Nodes over time."""

    apis: dict[str, client.ApiClient]
    namespace: str
    allocatable: dict[str, Decimal]  # the pool's total, per resource
    pods_per_job: dict[str, int]  # job name -> its trainer pods
    kind_of: dict[str, str] = field(default_factory=dict)  # job name -> its kind
    all_running: dict[str, float] = field(default_factory=dict)  # job -> first seen so
    ran_on: dict[str, str] = field(default_factory=dict)  # job -> the worker it ran on
    # The kind of each pod seen refused (by the job its labels name).
    unschedulable_kind: dict[tuple[str, str], str] = field(default_factory=dict)
    # What the running pods of each kind requested, per sample (same times as samples).
    kind_samples: list[tuple[float, dict[str, dict[str, Decimal]]]] = \
        field(default_factory=list)
    unschedulable: set[tuple[str, str]] = field(default_factory=set)
    # When each of those was first seen refused, and when it was bound after all: the
    # difference between a moment's wait for room and a pod stuck.
    refused_at: dict[tuple[str, str], float] = field(default_factory=dict)
    bound_at: dict[tuple[str, str], float] = field(default_factory=dict)
    samples: list[tuple[float, dict[str, Decimal]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> _PoolWatch:
        self._thread = threading.Thread(target=self._run, daemon=True, name="pool-watch")
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        cores = {name: client.CoreV1Api(api) for name, api in self.apis.items()}
        while not self._stop.wait(POLL_SECONDS):
            used: dict[str, Decimal] = {}
            used_by_kind: dict[str, dict[str, Decimal]] = {}
            running: dict[str, int] = {}  # job -> its trainer pods running
            where: dict[str, str] = {}  # job -> a worker running its trainer pods
            for worker, core in cores.items():
                try:
                    pods = core.list_namespaced_pod(self.namespace).items
                except ApiException as err:
                    log.warning("pool watch on %s: %s", worker, err.reason)
                    continue
                for pod in pods:
                    key = (worker, pod.metadata.name)
                    labels = pod.metadata.labels or {}
                    # A TrainJob's pods name its JobSet (the TrainJob's name); a batch
                    # Job's, the Job.
                    owner = labels.get(c.JOBSET_NAME_LABEL) or labels.get(JOB_NAME_LABEL)
                    kind = self.kind_of.get(owner, TRAINJOB)
                    for cond in (pod.status.conditions or []) if pod.status else []:
                        if cond.type == "PodScheduled" and cond.status == "False" and \
                                cond.reason == "Unschedulable" and key not in self.unschedulable:
                            # Which Nodes refused it and why: what a fix starts from.
                            log.info("unschedulable on %s: %s: %s", worker,
                                     pod.metadata.name, cond.message)
                            self.refused_at[key] = time.time()
                            self.unschedulable.add(key)
                            self.unschedulable_kind[key] = kind
                    if key in self.refused_at and key not in self.bound_at and \
                            pod.spec and pod.spec.node_name:
                        self.bound_at[key] = time.time()
                    if pod.status and pod.status.phase == "Running":
                        # A job runs when its trainer pods do (its initializers come first);
                        # a batch Job's pods are all trainers.
                        job = None
                        if labels.get(c.JOBSET_REPLICATED_JOB_LABEL) == c.NODE:
                            job = labels.get(c.JOBSET_NAME_LABEL)
                        elif c.JOBSET_NAME_LABEL not in labels and \
                                self.kind_of.get(owner) == BATCH_JOB:
                            job = owner
                        if job is not None:
                            running[job] = running.get(job, 0) + 1
                            where[job] = worker
                        mine = used_by_kind.setdefault(kind, {})
                        for container in pod.spec.containers:
                            for resource, value in ((container.resources.requests or {})
                                                    if container.resources else {}).items():
                                if resource in self.allocatable:
                                    amount = parse_quantity(value)
                                    used[resource] = used.get(resource, Decimal(0)) + amount
                                    mine[resource] = mine.get(resource, Decimal(0)) + amount
            now = time.time()
            self.samples.append((now, used))
            self.kind_samples.append((now, used_by_kind))
            for job, count in running.items():
                if job in self.pods_per_job and count >= self.pods_per_job[job]:
                    self.all_running.setdefault(job, now)
                    self.ran_on.setdefault(job, where[job])

    def longest_refused(self, end: float, kind: str | None = None) -> float | None:
        """Seconds the longest-refused pod (of ``kind``, if given) waited to be bound (to
        ``end`` if it never was); None when none was refused."""
        waits = [self.bound_at.get(key, end) - at for key, at in self.refused_at.items()
                 if kind is None or self.unschedulable_kind.get(key) == kind]
        return round(max(waits), 1) if waits else None

    def utilisation(self, start: float, end: float,
                    kind: str | None = None) -> dict[str, float | None]:
        """Mean share of the pool's allocatable requested by running pods (of ``kind``,
        if given), per resource, over the samples between ``start`` and ``end``."""
        if kind is None:
            window = [used for at, used in self.samples if start <= at <= end]
        else:
            window = [by_kind.get(kind, {}) for at, by_kind in self.kind_samples
                      if start <= at <= end]
        if not window:
            return dict.fromkeys(self.allocatable)
        return {resource: round(float(sum(u.get(resource, Decimal(0)) for u in window)
                                      / len(window) / total), 3)
                for resource, total in self.allocatable.items() if total > 0}


def _pool_allocatable(workers: list[str]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for sizes in POOL_NODES[:len(workers)]:
        for node in sizes:
            for resource, value in node.items():
                total[resource] = total.get(resource, Decimal(0)) + parse_quantity(value)
    return total


def prepare(env, workers: list[str], namespace: str | None = None) -> None:
    """The pool's Nodes and runtimes on each worker, and a training operator on each (and
    the runtimes on a manager that runs Kueue, which reads them to size a job).
    ``namespace``: the operators reconcile only there (the earlier scenarios' copies, never
    run, would otherwise all start at once and bury the workload)."""
    if getattr(env, "kueue", False):
        _install_runtimes(env.apis["manager"])
    # Workers past the pool's sizes get no pool, and no operator below.
    for worker, sizes in zip(workers, POOL_NODES, strict=False):
        api = env.apis[worker]
        for index, size in enumerate(sizes):
            fixtures.add_node(api, f"{worker}-pool-{index}", {**NODE_BASE, **size},
                              labels={POOL_LABEL: POOL})
        _install_runtimes(api)
    env.start_operators(workers[:len(POOL_NODES)], namespace)


def _install_runtimes(api) -> None:
    for runtime, run_for in RUN_TIMES.items():
        # Initializers first, as in upstream Trainer's runtimes that have them: a trainer
        # created beside its initializers can find them on the one Node it fits on.
        fixtures.install_runtime(api, fixtures.torch_runtime(
            runtime, cpu="100m", memory="64Mi", node_selector={POOL_LABEL: POOL},
            pod_annotations={worker_stack.RUN_FOR_ANNOTATION: run_for},
            initializers_first=True,
            initializer_annotations={worker_stack.RUN_FOR_ANNOTATION: INITIALIZER_RUN_FOR}))


def tear_down(env, workers: list[str]) -> None:
    """The operators stopped; the pool's Nodes and runtimes removed."""
    env.stop_operators()
    for worker, sizes in zip(workers, POOL_NODES, strict=False):
        core = client.CoreV1Api(env.apis[worker])
        custom = client.CustomObjectsApi(env.apis[worker])
        for index in range(len(sizes)):
            _ignore_missing(lambda: core.delete_node(f"{worker}-pool-{index}"))
        for runtime in RUN_TIMES:
            _ignore_missing(lambda: custom.delete_cluster_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, c.CLUSTERTRAININGRUNTIMES, runtime))


def _ignore_missing(call: Callable[[], object]) -> None:
    try:
        call()
    except ApiException as err:
        if err.status != 404:
            raise


def constrained(ctx, namespace: str, workers: list[str], count: int,
                submit: Submit = standalone, timeout: float = 600,
                kinds: tuple[str, ...] = (TRAINJOB,)) -> dict:
    """Run the workload to the end under whatever dispatcher is running; the figures.
    ``kinds``: what the jobs are submitted as, in turn (see ``workload``); with more than
    TrainJobs, ``submit`` must queue a batch Job through Kueue (the standalone dispatcher
    takes TrainJobs only), and the figures have each kind's too (``kinds``)."""
    env = ctx.env
    pool_workers = workers[:len(POOL_NODES)]
    jobs = workload(count, kinds=kinds)
    batch_names = {job.name for job in jobs if job.kind == BATCH_JOB}
    if batch_names and submit is standalone:
        raise ValueError("the standalone dispatcher dispatches TrainJobs only: batch Jobs "
                         "in the constrained mix need a contender behind Kueue")
    env.create_namespace(namespace, ["manager", *pool_workers])
    keys = [(namespace, job.name) for job in jobs]
    clusters = ["manager", *pool_workers]
    # Each job's watches, per cluster: the run's TrainJob watches, or this run's own of
    # its batch Jobs (only those: the workers' JobSets make Jobs of their own).
    batch = _batch_job_timelines(ctx, clusters, namespace, batch_names) if batch_names else {}
    seen = {key: (batch if job.kind == BATCH_JOB else ctx.timelines.clusters)
            for job, key in zip(jobs, keys, strict=True)}
    calls = [(ctx.kubeconfig("manager"),
              (create_batch_job_call if job.kind == BATCH_JOB else create_call)(
                  namespace, submit(job.body())))
             for job in jobs]
    finished = c.FINISHED_CONDITIONS
    try:
        with _PoolWatch({w: env.apis[w] for w in pool_workers}, namespace,
                        _pool_allocatable(pool_workers),
                        {job.name: job.nodes for job in jobs},
                        kind_of={job.name: job.kind for job in jobs}) as pool:
            run = ctx.runner.run(calls)
            missing = ctx.timelines.wait(
                lambda: {k for k in keys if not any(
                    (*k, t) in seen[k]["manager"].condition_seen for t in finished)},
                timeout)
        manager_side = (_manager_batch_jobs(env, namespace, batch_names)
                        if batch_names else None)
    finally:
        for timeline in batch.values():
            timeline.stop()
    ends = {k: min(seen[k]["manager"].condition_seen[(*k, t)] for t in finished
                   if (*k, t) in seen[k]["manager"].condition_seen)
            for k in keys if k not in missing}
    withdrawn: dict[tuple[str, str], int] = {}
    for key in keys:
        withdrawn[key] = 0
        for name in pool_workers:
            copy = seen[key][name]
            # A copy deleted before it (or its job) finished was withdrawn; one deleted
            # after finishing is the usual clean-up. Each watch has its own delay, so the
            # copy's own finish (same watch as its deletion) decides.
            done_at = min([ends.get(key, float("inf"))] + [
                copy.condition_seen[(*key, t)] for t in finished
                if (*key, t) in copy.condition_seen])
            withdrawn[key] += sum(1 for at in copy.deleted.get(key, []) if at < done_at)
    last_end = max(ends.values()) if ends else time.time()

    def measure(kind: str | None) -> dict:
        """The figures of the jobs of ``kind`` (None: every job)."""
        mine = [(job, key) for job, key in zip(jobs, keys, strict=True) if kind in (None, job.kind)]
        my_ends = [ends[key] for _, key in mine if key in ends]
        my_missing = [key for _, key in mine if key in missing]
        makespan = (max(my_ends) - run.first_start) if my_ends and not my_missing else None
        placements = {name: sum(1 for _, key in mine if key in seen[key][name].added)
                      for name in pool_workers}
        return {
            "finished": len(my_ends), "missing": len(my_missing),
            "failed": sum(1 for _, key in mine
                          if (*key, c.CONDITION_FAILED) in seen[key]["manager"].condition_seen),
            "makespan_seconds": round(makespan, 1) if makespan else None,
            # Waiting for room included: a job that cannot start yet waits here, not
            # Pending.
            "running_latency": summary_ms([
                pool.all_running[job.name] - seen[key]["manager"].added[key]
                for job, key in mine
                if job.name in pool.all_running and key in seen[key]["manager"].added]),
            "never_all_running": sum(1 for job, _ in mine if job.name not in pool.all_running),
            "pods_unschedulable": len(pool.unschedulable) if kind is None else sum(
                1 for key in pool.unschedulable if pool.unschedulable_kind.get(key) == kind),
            "longest_unschedulable_seconds": pool.longest_refused(last_end, kind),
            "copies_withdrawn": sum(withdrawn[key] for _, key in mine),
            "utilisation": pool.utilisation(run.first_start, last_end, kind),
            "placements": placements,
        }

    whole = measure(None)
    figures = {
        "jobs": count, "workers": len(pool_workers),
        "pool": {resource: str(amount) for resource, amount in pool.allocatable.items()},
        "gpu_jobs": sum(1 for job in jobs if job.gpus),
        **{name: whole[name] for name in (
            "finished", "missing", "failed", "makespan_seconds", "running_latency",
            "never_all_running", "pods_unschedulable", "longest_unschedulable_seconds",
            "copies_withdrawn", "utilisation", "placements")},
    }
    if tuple(kinds) != (TRAINJOB,):
        figures["kind_mix"] = list(kinds)
        figures["kinds"] = {}
        for kind in dict.fromkeys(job.kind for job in jobs):
            mine = [job for job in jobs if job.kind == kind]
            figures["kinds"][kind] = {
                "jobs": len(mine), "gpu_jobs": sum(1 for job in mine if job.gpus),
                **measure(kind),
                # Which worker ran each job's pods (all of them seen Running there).
                "ran_on": {job.name: pool.ran_on.get(job.name) for job in mine}}
        if manager_side is not None:
            figures["kinds"][BATCH_JOB]["manager"] = manager_side
    log.info("constrained, %d jobs: makespan %s s, %d pods unschedulable (longest %s s), "
             "%d copies withdrawn, utilisation %s", count, figures["makespan_seconds"],
             figures["pods_unschedulable"], figures["longest_unschedulable_seconds"],
             figures["copies_withdrawn"], figures["utilisation"])
    for kind, mine in figures.get("kinds", {}).items():
        log.info("constrained, %d %s: makespan %s s (%d/%d finished), %d pods "
                 "unschedulable, %d copies withdrawn, utilisation %s", mine["jobs"], kind,
                 mine["makespan_seconds"], mine["finished"], mine["jobs"],
                 mine["pods_unschedulable"], mine["copies_withdrawn"], mine["utilisation"])
    return figures


def _batch_job_timelines(ctx, clusters: list[str], namespace: str,
                         names: set[str]) -> dict[str, TrainJobTimeline]:
    """Watches of the batch Jobs ``names`` of ``namespace`` on each of ``clusters``, on the
    run's shared condition (so one wait spans them and the TrainJobs' watches)."""
    def key_of(job: dict) -> str | None:
        meta = job["metadata"]
        return meta["name"] if meta.get("namespace") == namespace and \
            meta["name"] in names else None

    started: dict[str, TrainJobTimeline] = {}
    try:
        for name in clusters:
            started[name] = TrainJobTimeline(name, ctx.kubeconfig(name), ctx.timelines.changed,
                                             BATCH_JOB_RESOURCE, key_of).start()
    except BaseException:
        for timeline in started.values():
            timeline.stop()
        raise
    return started


def _manager_batch_jobs(env, namespace: str, names: set[str]) -> dict:
    """What the manager holds of the batch Jobs: each Job's ``spec.managedBy`` (Kueue's
    MultiKueue, so the manager runs none of them) and how many pods the namespace has
    there (none: the manager runs no job controller)."""
    batch = client.BatchV1Api(env.apis["manager"])
    managed_by: dict[str, int] = {}
    for job in batch.list_namespaced_job(namespace).items:
        if job.metadata.name in names:
            value = job.spec.managed_by or "(none: the job controller's)"
            managed_by[value] = managed_by.get(value, 0) + 1
    pods = client.CoreV1Api(env.apis["manager"]).list_namespaced_pod(namespace).items
    return {"managed_by": managed_by, "pods": len(pods)}
