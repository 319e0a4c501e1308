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

Submit = Callable[[dict], dict]  # TrainJob body -> the body as submitted


@dataclass(frozen=True)
class Job:
    name: str
    nodes: int
    cpu: int
    gpus: int
    runtime: str

    def body(self) -> dict:
        resources: dict[str, dict[str, str]] = {"requests": {"cpu": str(self.cpu),
                                                             "memory": "1Gi"}}
        if self.gpus:
            # GPUs cannot be overcommitted: the API requires the limit, equal to the request.
            resources["requests"][GPU] = str(self.gpus)
            resources["limits"] = {GPU: str(self.gpus)}
        return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
                "metadata": {"name": self.name},
                "spec": {"runtimeRef": {"name": self.runtime},
                         "trainer": {"numNodes": self.nodes, "resourcesPerNode": resources}}}


def standalone(body: dict) -> dict:
    """How jobs reach this dispatcher on its own."""
    body["spec"]["managedBy"] = c.MANAGED_BY_MULTIKUEUE
    return body


def workload(count: int, seed: int = 7) -> list[Job]:
    """``count`` jobs, the same for every run with the same seed: a quarter want GPUs
    (which only one worker has), the rest 2-12 cpu per node on one or two nodes."""
    rng = random.Random(seed)
    jobs = []
    runtimes = sorted(RUN_TIMES)
    for index in range(count):
        gpus = rng.choice((1, 2)) if index % 4 == 3 else 0
        jobs.append(Job(name=f"mixed-{index:03d}", nodes=rng.choice((1, 1, 2)),
                        cpu=rng.choice((2, 4, 6, 8, 12)) if not gpus else rng.choice((2, 4)),
                        gpus=gpus, runtime=rng.choice(runtimes)))
    return jobs


@dataclass
class _PoolWatch:
    """Polls the namespace's pods on each worker: which were ever unschedulable, and what
    the running ones request of the pool's Nodes over time."""

    apis: dict[str, client.ApiClient]
    namespace: str
    allocatable: dict[str, Decimal]  # the pool's total, per resource
    pods_per_job: dict[str, int]  # job name -> its trainer pods
    all_running: dict[str, float] = field(default_factory=dict)  # job -> first seen so
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
            running: dict[str, int] = {}
            for worker, core in cores.items():
                try:
                    pods = core.list_namespaced_pod(self.namespace).items
                except ApiException as err:
                    log.warning("pool watch on %s: %s", worker, err.reason)
                    continue
                for pod in pods:
                    key = (worker, pod.metadata.name)
                    for cond in (pod.status.conditions or []) if pod.status else []:
                        if cond.type == "PodScheduled" and cond.status == "False" and \
                                cond.reason == "Unschedulable" and key not in self.unschedulable:
                            # Which Nodes refused it and why: what a fix starts from.
                            log.info("unschedulable on %s: %s: %s", worker,
                                     pod.metadata.name, cond.message)
                            self.refused_at[key] = time.time()
                            self.unschedulable.add(key)
                    if key in self.refused_at and key not in self.bound_at and \
                            pod.spec and pod.spec.node_name:
                        self.bound_at[key] = time.time()
                    if pod.status and pod.status.phase == "Running":
                        labels = pod.metadata.labels or {}
                        # A job runs when its trainer pods do (its initializers come first).
                        if labels.get(c.JOBSET_REPLICATED_JOB_LABEL) == c.NODE:
                            job = labels.get(c.JOBSET_NAME_LABEL)
                            running[job] = running.get(job, 0) + 1
                        for container in pod.spec.containers:
                            for resource, value in ((container.resources.requests or {})
                                                    if container.resources else {}).items():
                                if resource in self.allocatable:
                                    used[resource] = used.get(resource, Decimal(0)) + \
                                        parse_quantity(value)
            now = time.time()
            self.samples.append((now, used))
            for job, count in running.items():
                if job in self.pods_per_job and count >= self.pods_per_job[job]:
                    self.all_running.setdefault(job, now)

    def longest_refused(self, end: float) -> float | None:
        """Seconds the longest-refused pod waited to be bound (to ``end`` if it never
        was); None when none was refused."""
        waits = [self.bound_at.get(key, end) - at for key, at in self.refused_at.items()]
        return round(max(waits), 1) if waits else None

    def utilisation(self, start: float, end: float) -> dict[str, float | None]:
        """Mean share of the pool's allocatable requested by running pods, per resource,
        over the samples between ``start`` and ``end``."""
        window = [used for at, used in self.samples if start <= at <= end]
        if not window:
            return {resource: None for resource in self.allocatable}
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
    for worker, sizes in zip(workers, POOL_NODES):
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
    for worker, sizes in zip(workers, POOL_NODES):
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
                submit: Submit = standalone, timeout: float = 600) -> dict:
    """Run the workload to the end under whatever dispatcher is running; the figures."""
    env = ctx.env
    pool_workers = workers[:len(POOL_NODES)]
    env.create_namespace(namespace, ["manager", *pool_workers])
    jobs = workload(count)
    keys = [(namespace, job.name) for job in jobs]
    manager = ctx.timelines.manager
    calls = [(ctx.kubeconfig("manager"), create_call(namespace, submit(job.body())))
             for job in jobs]
    finished = (c.CONDITION_COMPLETE, c.CONDITION_FAILED)
    with _PoolWatch({w: env.apis[w] for w in pool_workers}, namespace,
                    _pool_allocatable(pool_workers),
                    {job.name: job.nodes for job in jobs}) as pool:
        run = ctx.runner.run(calls)
        missing = ctx.timelines.wait(
            lambda: {k for k in keys
                     if not any((*k, t) in manager.condition_seen for t in finished)},
            timeout)
    ends = {k: min(manager.condition_seen[(*k, t)] for t in finished
                   if (*k, t) in manager.condition_seen) for k in keys if k not in missing}
    makespan = (max(ends.values()) - run.first_start) if ends and not missing else None
    withdrawn = 0
    for key in keys:
        for name in pool_workers:
            seen = ctx.timelines.clusters[name]
            # A copy deleted before it (or its job) finished was withdrawn; one deleted
            # after finishing is the usual clean-up. Each watch has its own delay, so the
            # copy's own finish (same watch as its deletion) decides.
            done_at = min([ends.get(key, float("inf"))] + [
                seen.condition_seen[(*key, t)] for t in finished
                if (*key, t) in seen.condition_seen])
            withdrawn += sum(1 for at in seen.deleted.get(key, []) if at < done_at)
    last_end = max(ends.values()) if ends else time.time()
    figures = {
        "jobs": count, "workers": len(pool_workers),
        "pool": {resource: str(amount) for resource, amount in pool.allocatable.items()},
        "gpu_jobs": sum(1 for job in jobs if job.gpus),
        "finished": len(ends), "missing": len(missing),
        "failed": sum(1 for k in keys if (*k, c.CONDITION_FAILED) in manager.condition_seen),
        "makespan_seconds": round(makespan, 1) if makespan else None,
        # Waiting for room included: a job that cannot start yet waits here, not Pending.
        "running_latency": summary_ms([pool.all_running[job.name] - manager.added[key]
                                       for job, key in zip(jobs, keys)
                                       if job.name in pool.all_running and key in manager.added]),
        "never_all_running": sum(1 for job in jobs if job.name not in pool.all_running),
        "pods_unschedulable": len(pool.unschedulable),
        "longest_unschedulable_seconds": pool.longest_refused(last_end),
        "copies_withdrawn": withdrawn,
        "utilisation": pool.utilisation(run.first_start, last_end),
        "placements": _placements(ctx, keys, pool_workers),
    }
    log.info("constrained, %d jobs: makespan %s s, %d pods unschedulable (longest %s s), "
             "%d copies withdrawn, utilisation %s", count, figures["makespan_seconds"],
             figures["pods_unschedulable"], figures["longest_unschedulable_seconds"],
             withdrawn, figures["utilisation"])
    return figures


def _placements(ctx, keys, workers: list[str]) -> dict[str, int]:
    counts = {name: 0 for name in workers}
    for key in keys:
        for name in workers:
            if key in ctx.timelines.clusters[name].added:
                counts[name] += 1
    return counts
