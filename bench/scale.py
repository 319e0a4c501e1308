"""The dispatcher on workers the size of real GPU clusters (``python -m bench --suite
scale``).

Each worker gets a fleet of kwok Nodes of mixed sizes (60 % 32-cpu/128Gi, 30 % 96-cpu/
384Gi, 10 % GPU Nodes 96-cpu/1Ti/8 GPUs tainted ``nvidia.com/gpu=present:NoSchedule``),
with zone, instance-type and pool labels, and Pods created already bound (``spec.nodeName``:
no scheduler work): three daemon Pods on every Node and workload Pods spread over the
Nodes (GPU Pods on half of the GPU Nodes, some Pods labelled as a JobSet's), which kwok
marks Running and keeps so. About half of each Node stays free, so the measured jobs fit.

At each size of the growth axis (smallest first; the full size last) the run measures:

* memory: the dispatcher's settled RSS, started on the empty workers, after the Nodes and
  after the Pods: bytes per cached Node and per cached Pod; its peak RSS (VmHWM);
* start to caches synced: process start to its "running" line (it logs that once every
  worker's caches have listed, or after 60 s), and the dispatcher's own
  ``dispatcher_worker_cache_sync_seconds`` gauge and "caches synced in" lines when it has
  them;
* one placement decision's wall (and CPU, when logged) time for small, wide and GPU jobs:
  jobs created one at a time, each deleted (copy gone) before the next, each job's
  ``place`` step read from the dispatcher's log.

At the full size also: a standby taking over (a second dispatcher with the same
configuration, the leader stopped, a job created: time to its copy), the dispatcher's CPU
spent following Pod churn (a delete and a bound replacement at a steady rate per worker),
and dispatch latency at steady arrival rates while the churn goes on, each job deleted as
soon as its copy is seen (jobs leave as fast as they arrive). No training operator runs
on these workers: the copies only exist, and get no pods, so a copy left in place would
keep its reservation and make every later placement dearer. After each rate, the floor at
that rate under the same churn (``bench.floor``: the dispatcher's writes per job made by a
plain client that places nothing), its latency beside the dispatcher's; and, from the
dispatcher's ``dispatcher_capacity_event_apply_seconds``, how long a Pod event took to be
counted in the room placement reads, during the churn alone and during each rate.
"""

from __future__ import annotations

import datetime
import logging
import random
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from bench import dispatch_log, floor, scenarios
from bench.environment import BenchClusters, describe
from bench.footprint import CpuAccount, FootprintWindow, peak_rss_bytes, rss_bytes
from bench.load import LoadRunner
from bench.settings import BenchSettings
from bench.stats import percentile, summary_ms
from bench.timeline import Timelines
from clusters import fixtures, worker_stack
from clusters.nodes import (
    GPU,
    KWOK_ANNOTATION,
    KWOK_ANNOTATION_VALUE,
    NOT_READY_TAINT,
    UNREACHABLE_TAINT,
)
from clusters.testing import ServiceProcess, eventually
from controller_kit import writes
from controller_kit.kubeclient import api_client
from trainjob import constants as c

log = logging.getLogger(__name__)

FLEET_LABEL = "bench.trainjob-dispatcher.io/fleet"
POOL_LABEL = "bench.trainjob-dispatcher.io/fleet-pool"
ZONE_LABEL = "topology.kubernetes.io/zone"
INSTANCE_LABEL = "node.kubernetes.io/instance-type"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}
# Node kinds: (pool, instance type, allocatable); a Node's kind follows its index (of every
# ten: six general, three large, one GPU), so a fleet of any size has the same mix.
GENERAL = ("general", "m-32", {"cpu": "32", "memory": "128Gi", "pods": "110"})
LARGE = ("large", "m-96", {"cpu": "96", "memory": "384Gi", "pods": "110"})
GPU_NODE = ("gpu", "g-96-8x", {"cpu": "96", "memory": "1Ti", GPU: "8", "pods": "110"})
KINDS = [GENERAL] * 6 + [LARGE] * 3 + [GPU_NODE]
ZONES = ("zone-a", "zone-b", "zone-c")
# Per Node: (name, cpu millicores, memory MiB), tolerating every taint as DaemonSets do.
DAEMONS = (("log-agent", 100, 128), ("node-exporter", 50, 64), ("network", 200, 256))
SYSTEM_NAMESPACE = "fleet-system"
WORK_NAMESPACE = "fleet-work"
# Workload Pods request a share of their Node: these multiples of 1/32 of its cpu (and
# memory alike) in turn, about 17 Pods a Node, so about half of each Node stays free.
WORK_SHARES = (0.5, 1.0, 1.0, 1.5)
# GPU workload Pods: 2 GPUs, 16 cpu, 64Gi each, two on each of half of the GPU Nodes.
GPU_POD = {"cpu": 16000, "memory": 65536, "gpus": 2}
# A workload Pod in this many is one of an 8-Pod JobSet's (labelled as JobSet labels its).
JOBSET_EVERY, JOBSET_SIZE = 3, 8
RUNTIME = "bench-scale"
SHAPES = ("small", "wide", "gpu")
WIDE_CPU, GPU_JOB_CPU = 8, 16
POLL = 1.0
GIVE_UP_AFTER = 3  # jobs of one shape not dispatched before the rest of them are skipped
_LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
STARTING_LINE = "dispatcher starting"
STARTED_LINE = " running; metrics on "
SYNCED_TEXT = "caches synced in"
_SYNCED_LINE = re.compile(r"(?P<worker>[\w.-]+): caches synced in (?P<seconds>[\d.]+) ?s")
SYNC_GAUGE = "dispatcher_worker_cache_sync_seconds"
APPLY_HISTOGRAM = "dispatcher_capacity_event_apply_seconds"
HANDLER_HISTOGRAM = "dispatcher_capacity_event_handler_seconds"
# Budgets: the dispatcher's dispatch p99 against the floor's, a Pod event's apply p99, one
# wide job's placement CPU p99.
FLOOR_RATIO, APPLY_MS, WIDE_CPU_MS = 1.25, 5.0, 10.0


# --- the fleet -------------------------------------------------------------------------

@dataclass
class FleetNode:
    name: str
    pool: str
    cpu_m: int
    memory_mi: int
    gpus: int
    used_cpu_m: int = 0
    used_memory_mi: int = 0
    used_gpus: int = 0


@dataclass
class Fleet:
    """One worker's Nodes and Pods, as bodies, and what the Pods leave free."""

    worker: str
    nodes: list[FleetNode] = field(default_factory=list)
    node_bodies: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)

    def free_slots(self, cpu_m: int, gpus: int = 0, pool: str | None = None) -> int:
        """How many Pods of ``cpu_m`` (and ``gpus``) fit on the Nodes (of ``pool``)."""
        total = 0
        for node in self.nodes:
            if pool and node.pool != pool:
                continue
            if pool is None and node.pool == "gpu":
                continue
            fits = (node.cpu_m - node.used_cpu_m) // cpu_m
            if gpus:
                fits = min(fits, (node.gpus - node.used_gpus) // gpus)
            total += max(0, fits)
        return total


def _quantity_mi(text: str) -> int:
    units = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    return int(text[:-2]) * units[text[-2:]]


def build_fleet(worker: str, nodes: int, pods: int, seed: int = 1) -> Fleet:
    """``nodes`` Node bodies and ``pods`` Pod bodies (daemons first) for ``worker``."""
    rng = random.Random(f"{worker}-{seed}")
    fleet = Fleet(worker)
    for index in range(nodes):
        pool, instance, allocatable = KINDS[index % len(KINDS)]
        name = f"{worker}-{pool}-{index:05d}"
        node = FleetNode(name, pool, int(allocatable["cpu"]) * 1000,
                         _quantity_mi(allocatable["memory"]), int(allocatable.get(GPU, 0)))
        fleet.nodes.append(node)
        fleet.node_bodies.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "type": "kwok", FLEET_LABEL: "true", POOL_LABEL: pool,
                                    ZONE_LABEL: ZONES[index % len(ZONES)],
                                    INSTANCE_LABEL: instance}},
            "spec": {"taints": [GPU_TAINT] if pool == "gpu" else []},
            "status": {"capacity": allocatable, "allocatable": allocatable}})
    for node in fleet.nodes:
        for daemon, cpu_m, memory_mi in DAEMONS:
            if len(fleet.pods) >= pods:
                break
            fleet.pods.append(_pod(SYSTEM_NAMESPACE, f"{daemon}-{node.name}", node,
                                   cpu_m, memory_mi, 0, {"app": daemon},
                                   [{"operator": "Exists"}]))
    gpu_nodes = [n for n in fleet.nodes if n.pool == "gpu"]
    # Half of the GPU Nodes (every other one, from the second) take GPU Pods; the rest
    # keep their GPUs free for the measured GPU jobs.
    busy_gpu = [n for i, n in enumerate(gpu_nodes) if i % 2 == 1]
    cpu_nodes = [n for n in fleet.nodes if n.pool != "gpu"]
    gpu_pods = [(n, i) for n in busy_gpu for i in range(2)]
    count = 0
    while len(fleet.pods) < pods and cpu_nodes:
        if gpu_pods and count % 20 == 0:
            node, _ = gpu_pods.pop()
            cpu_m, memory_mi, gpus, tolerations = (GPU_POD["cpu"], GPU_POD["memory"],
                                                   GPU_POD["gpus"], [GPU_TOLERATION])
        else:
            node = cpu_nodes[count % len(cpu_nodes)]
            share = rng.choice(WORK_SHARES)
            cpu_m, memory_mi = int(node.cpu_m * share / 32), int(node.memory_mi * share / 32)
            gpus, tolerations = 0, []
        labels = {"app": f"service-{count % 50}"}
        if count % JOBSET_EVERY == 0:
            labels[c.JOBSET_NAME_LABEL] = f"fleet-jobset-{count // (JOBSET_EVERY * JOBSET_SIZE)}"
        fleet.pods.append(_pod(WORK_NAMESPACE, f"work-{count:06d}", node, cpu_m, memory_mi,
                               gpus, labels, tolerations))
        count += 1
    return fleet


def _pod(namespace: str, name: str, node: FleetNode, cpu_m: int, memory_mi: int, gpus: int,
         labels: dict, tolerations: list[dict]) -> dict:
    node.used_cpu_m += cpu_m
    node.used_memory_mi += memory_mi
    node.used_gpus += gpus
    resources: dict = {"requests": {"cpu": f"{cpu_m}m", "memory": f"{memory_mi}Mi"}}
    if gpus:
        resources["requests"][GPU] = str(gpus)
        resources["limits"] = {GPU: str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         # kwok keeps it Running until it is deleted.
                         "annotations": {worker_stack.OUTCOME_ANNOTATION:
                                         worker_stack.OUTCOME_NEVER}},
            "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 0,
                     "tolerations": tolerations,
                     "containers": [{"name": "main", "image": "registry.local/fleet:1",
                                     "resources": resources}]}}


def create_pod_call(body: dict):
    path = writes.object_path("", "v1", body["metadata"]["namespace"], "pods")

    def call(custom: client.CustomObjectsApi) -> object:
        return writes.request_json(custom.api_client, "POST", path, body)
    return call


def _create_node_call(body: dict):
    def call(custom: client.CustomObjectsApi) -> object:
        return writes.request_json(custom.api_client, "POST", "/api/v1/nodes", body)
    return call


def _listed(api: client.ApiClient, path: str, query: list[tuple[str, str]]) -> dict:
    return writes.request_json(api, "GET", path, None, query=query, timeout=120)


def _any(api: client.ApiClient, field_selector: str) -> bool:
    """Whether any Pod (every namespace) matches ``field_selector``: a list of one."""
    listed = _listed(api, "/api/v1/pods", [("fieldSelector", field_selector), ("limit", "1")])
    return bool(listed["items"])


def _pod_count(api: client.ApiClient) -> int:
    """Pods in every namespace: a list of one and the count of the rest (an apiserver
    counts the rest only for a list without selectors)."""
    listed = _listed(api, "/api/v1/pods", [("limit", "1")])
    return len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)


def _nodes_not_ready(api: client.ApiClient) -> tuple[int, int]:
    """(fleet Nodes, of them not Ready or still tainted not-ready/unreachable)."""
    listed = _listed(api, "/api/v1/nodes", [("labelSelector", FLEET_LABEL)])
    waiting = 0
    for node in listed["items"]:
        ready = any(x.get("type") == "Ready" and x.get("status") == "True"
                    for x in (node.get("status") or {}).get("conditions") or [])
        tainted = any(t.get("key") in (NOT_READY_TAINT, UNREACHABLE_TAINT)
                      for t in node.get("spec", {}).get("taints") or [])
        waiting += (not ready) or tainted
    return len(listed["items"]), waiting


def _wait(what: str, check, timeout: float) -> float:
    """Seconds until ``check()`` is true; a TimeoutError naming ``what`` and the last
    reading after ``timeout``."""
    started = time.monotonic()
    while True:
        ok, seen = check()
        if ok:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s (last seen: {seen})")
        time.sleep(POLL)


def empty(env: BenchClusters, workers: list[str], timeout: float = 900) -> dict:
    """Remove the fleet (Pods' namespaces, then Nodes) from ``workers``; how long it took."""
    started = time.monotonic()
    for worker in workers:
        core = client.CoreV1Api(env.apis[worker])
        for namespace in (SYSTEM_NAMESPACE, WORK_NAMESPACE):
            try:
                core.delete_namespace(namespace)
            except ApiException as err:
                if err.status != 404:
                    raise
    for worker in workers:
        api = env.apis[worker]
        _wait(f"{worker}: fleet namespaces gone", lambda api=api: (
            not [n for n in _listed(api, "/api/v1/namespaces", [])["items"]
                 if n["metadata"]["name"] in (SYSTEM_NAMESPACE, WORK_NAMESPACE)],
            _pod_count(api)), timeout)
        client.CoreV1Api(api).delete_collection_node(label_selector=FLEET_LABEL)
        _wait(f"{worker}: fleet Nodes gone", lambda api=api: (
            _nodes_not_ready(api)[0] == 0, _nodes_not_ready(api)), timeout)
    return {"seconds": round(time.monotonic() - started, 1)}


# --- the dispatcher's memory and start ---------------------------------------------------

def settled_rss(pid: int, quiet: float = 3.0, tolerance: float = 0.02,
                timeout: float = 60.0) -> dict:
    """The process's RSS once it stopped moving by more than ``tolerance`` over ``quiet``
    seconds (or after ``timeout``, marked unsettled)."""
    started = time.monotonic()
    samples: list[tuple[float, int]] = []
    while True:
        now = time.monotonic()
        samples.append((now, rss_bytes(pid)))
        window = [rss for at, rss in samples if at >= now - quiet]
        settled = (now - started >= quiet and max(window) - min(window)
                   <= tolerance * max(window))
        if settled or now - started >= timeout:
            return {"rss_bytes": samples[-1][1], "settled": settled,
                    "seconds": round(now - started, 1)}
        time.sleep(0.5)


def _sync_figures(dispatcher: ServiceProcess) -> dict:
    """The dispatcher's own account of each worker's first complete list, when it gives
    one: its gauge and its log lines."""
    figures: dict = {}
    try:
        _, text = dispatcher.get("/metrics")
        gauge = {s.labels.get("cluster"): s.value
                 for family in text_string_to_metric_families(text)
                 for s in family.samples if s.name == SYNC_GAUGE}
        if gauge:
            figures["gauge_seconds"] = {k: round(v, 2) for k, v in sorted(gauge.items())}
    except OSError:
        pass
    logged = {m["worker"]: float(m["seconds"])
              for m in _SYNCED_LINE.finditer(dispatcher.log_file.read_text(errors="replace"))}
    if logged:
        figures["logged_seconds"] = logged
    return figures


def _logged_at(log_file: Path, offset: int, text: str, last: bool = False) -> float | None:
    """The wall time (its log line's timestamp) of the first (``last``: the last) line
    after ``offset`` holding ``text``."""
    found = None
    with open(log_file, errors="replace") as lines:
        lines.seek(offset)
        for line in lines:
            if text in line and (match := _LOG_TIME.match(line)):
                found = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if not last:
                    break
    return found


def start_measured(env: BenchClusters, workers: list[str], policy: str) -> dict:
    """The dispatcher (re)started: seconds from its process start to its "starting" line
    (the interpreter and imports), to every worker's caches synced (its last "caches synced"
    line; its "running" line where it logs none) and to its "running" line; its settled
    and peak RSS."""
    env.stop_dispatcher()
    log_file = env.log_dir / f"dispatcher-{env._dispatcher_runs + 1}-{env.config_name(workers)}.log"
    offset = log_file.stat().st_size if log_file.exists() else 0
    launched = time.time()
    dispatcher = env.start_dispatcher(workers, policy)
    running = _logged_at(dispatcher.log_file, offset, STARTED_LINE)
    synced = _logged_at(dispatcher.log_file, offset, SYNCED_TEXT, last=True) or running
    starting = _logged_at(dispatcher.log_file, offset, STARTING_LINE)
    pid = dispatcher.proc.pid
    rss = settled_rss(pid)

    def since(at: float | None) -> float | None:
        return round(at - launched, 2) if at is not None else None

    return {"start_to_synced_seconds": since(synced),
            "start_to_running_seconds": since(running),
            "start_to_starting_seconds": since(starting),
            "settled_rss_mb": round(rss["rss_bytes"] / 2**20, 1),
            "rss_settled": rss["settled"], "settle_seconds": rss["seconds"],
            "peak_rss_mb": round(peak_rss_bytes(pid) / 2**20, 1),
            **_sync_figures(dispatcher)}


def memory(env: BenchClusters, workers: list[str], policy: str, fleets: list[Fleet],
           threads: int) -> dict:
    """RSS on the empty workers, after the Nodes, after the Pods; per Node and per Pod."""
    empty_start = start_measured(env, workers, policy)
    env.stop_dispatcher()
    filled = fill_nodes_then_pods(env, workers, policy, fleets, threads)
    nodes, pods = filled["fill"]["nodes"], filled["fill"]["pods"]
    a = empty_start["settled_rss_mb"]
    b = filled["with_nodes"]["settled_rss_mb"]
    full = filled["with_pods"]
    return {
        "empty": empty_start, "with_nodes": filled["with_nodes"], "with_pods": full,
        "fill": filled["fill"],
        "bytes_per_node": round((b - a) * 2**20 / nodes) if nodes else None,
        "bytes_per_pod": round((full["settled_rss_mb"] - b) * 2**20 / pods) if pods else None,
    }


def create_nodes(env: BenchClusters, fleets: list[Fleet], runner: LoadRunner) -> dict:
    """The fleets' Nodes created and waited Ready (kwok); how long that took."""
    started = time.monotonic()
    run = runner.run([(env.kubeconfig(f.worker), _create_node_call(body))
                      for f in fleets for body in f.node_bodies])
    created = time.monotonic() - started
    expected = {f.worker: len(f.nodes) for f in fleets}

    def nodes_ready():
        seen = {f.worker: _nodes_not_ready(env.apis[f.worker]) for f in fleets}
        return (all(total == expected[w] and not waiting
                    for w, (total, waiting) in seen.items()), seen)

    ready = _wait("fleet Nodes Ready (kwok)", nodes_ready, 120 + len(run.ends) / 20)
    return {"nodes": sum(expected.values()), "nodes_create_seconds": round(created, 1),
            "nodes_creates_per_second": round(run.rate(), 1),
            "nodes_ready_wait_seconds": round(ready, 1)}


def create_pods(env: BenchClusters, fleets: list[Fleet], runner: LoadRunner,
                wait_running: bool = True) -> dict:
    """The fleets' Pods created (bound) and, with ``wait_running``, waited Running (kwok);
    how long that took."""
    for fleet in fleets:
        for namespace in (SYSTEM_NAMESPACE, WORK_NAMESPACE):
            fixtures.ensure_namespace(env.apis[fleet.worker], namespace)
    calls = [(env.kubeconfig(f.worker), create_pod_call(body))
             for f in fleets for body in f.pods]
    started = time.monotonic()
    pod_run = runner.run(calls)
    created = time.monotonic() - started

    def running():
        seen = {f.worker: (_pod_count(env.apis[f.worker]),
                           _any(env.apis[f.worker], "status.phase!=Running"))
                for f in fleets}
        return (all(total == len(f.pods) and not waiting
                    for f, (total, waiting) in zip(fleets, seen.values(), strict=True)),
                {w: {"pods": total, "some_not_running": waiting}
                 for w, (total, waiting) in seen.items()})

    if not wait_running:
        return {"pods": len(calls), "pods_create_seconds": round(created, 1),
                "pods_creates_per_second": round(pod_run.rate(), 1)}
    running_wait = _wait("fleet Pods Running (kwok)", running, 300 + len(calls) / 20)
    log.info("fleet Pods: %d created at %.0f/s, all Running %.1f s after the last create",
             len(calls), pod_run.rate(), running_wait)
    return {"pods": len(calls), "pods_create_seconds": round(created, 1),
            "pods_creates_per_second": round(pod_run.rate(), 1),
            "pods_create_retries": pod_run.retries,
            "pods_running_wait_seconds": round(running_wait, 1),
            "pods_seconds": round(created + running_wait, 1)}


def populate(env: BenchClusters, fleets: list[Fleet], threads: int,
             wait_running: bool = True) -> dict:
    """The fleets' Nodes (waited Ready), then their Pods (waited Running, with
    ``wait_running``; a bound Pod counts for its room either way); how long each took."""
    runner = LoadRunner(threads)
    try:
        return {**create_nodes(env, fleets, runner),
                **create_pods(env, fleets, runner, wait_running), "threads": threads}
    finally:
        runner.close()


def fill_nodes_then_pods(env: BenchClusters, workers: list[str], policy: str,
                         fleets: list[Fleet], threads: int) -> dict:
    """The Nodes, the dispatcher started on them, then the Pods and the dispatcher started
    again (its start at this size measured)."""
    runner = LoadRunner(threads)
    figures: dict = {}
    try:
        fill_figures = create_nodes(env, fleets, runner)
        figures["with_nodes"] = start_measured(env, workers, policy)
        env.stop_dispatcher()
        fill_figures.update(create_pods(env, fleets, runner), threads=threads)
        figures["fill"] = fill_figures
        figures["with_pods"] = start_measured(env, workers, policy)
    finally:
        runner.close()
    return figures


def gpu_hog(node: FleetNode, name: str) -> dict:
    """A Pod bound to GPU Node ``node`` that takes every GPU it has free."""
    return _pod(WORK_NAMESPACE, name, node, 1000, 1024, node.gpus - node.used_gpus,
                {"app": "gpu-hog"}, [GPU_TOLERATION])


# --- a standby taking over -------------------------------------------------------------------

def takeover(env: BenchClusters, timelines: Timelines, workers: list[str], policy: str,
             namespace: str = "scale-takeover") -> dict:
    """A second dispatcher with the same configuration, ready as standby; the leader
    stopped (SIGTERM: it gives up its Lease); one job created: time to its copy."""
    env.create_namespace(namespace, ["manager", *workers])
    config = env.config_name(workers)
    log_file = env.log_dir / f"dispatcher-standby-{config}.log"
    standby = ServiceProcess("dispatcher", env.kubeconfig("manager"), log_file,
                             (*env.dispatcher_args(config, policy),
                              *env.extra_dispatcher_args))
    started = time.monotonic()
    standby.start()
    eventually(standby.started, bool, timeout=120, interval=0.1,
               expected=f"the standby dispatcher to log that it runs (log: {log_file})")
    standby_ready = time.monotonic() - started
    status, why = standby.readyz()
    leader = env.dispatcher
    stop_sent = time.time()
    leader.stop()
    stopped = time.time()
    env.dispatcher = standby
    key = (namespace, "takeover-job")
    custom = client.CustomObjectsApi(env.apis["manager"])
    writes.create(custom.api_client, c.TRAINER_GROUP, c.TRAINER_VERSION, namespace,
                  c.TRAINJOBS, job_body("takeover-job", "small", {}))
    created = time.time()
    missing = timelines.wait_remotes({key}, 120)
    remote = timelines.remote(key)
    figures = {"standby_start_to_synced_seconds": round(standby_ready, 2),
               "standby_readyz": f"{status} {why.strip()[:80]}",
               "leader_stop_seconds": round(stopped - stop_sent, 2),
               "dispatched": not missing}
    if remote is not None:
        figures["create_to_copy_seconds"] = round(remote[1] - created, 3)
        figures["stop_to_copy_seconds"] = round(remote[1] - stop_sent, 3)
    log.info("standby took over: copy %s s after the leader's stop",
             figures.get("stop_to_copy_seconds"))
    return figures


# --- placement decisions -------------------------------------------------------------------

def runtime() -> dict:
    """A trainer-only ClusterTrainingRuntime: a job's pods are its numNodes trainers."""
    return {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": {"name": RUNTIME},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
                 "template": {"spec": {"replicatedJobs": [{
                     "name": c.NODE, "template": {
                         "metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                         "spec": {"template": {"spec": {
                             "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": c.NODE, "image": "pytorch/pytorch:2.5.0",
                                             "resources": {"requests": {
                                                 "cpu": "1", "memory": "1Gi"}}}]}}}}}]}}}}


def shapes(fleets: list[Fleet]) -> dict[str, dict]:
    """Pods and requests of each measured job shape, sized to what one worker's fleet
    leaves free (wide: up to 32 pods of 8 cpu; GPU: up to 4 pods of 8 GPUs)."""
    fleet = min(fleets, key=lambda f: f.free_slots(WIDE_CPU * 1000))
    wide = max(1, min(32, fleet.free_slots(WIDE_CPU * 1000) // 2))
    gpu = max(1, min(4, fleet.free_slots(GPU_JOB_CPU * 1000, 8, pool="gpu")))
    return {"small": {"pods": 1, "cpu": "2", "memory": "8Gi", "gpus": 0},
            "wide": {"pods": wide, "cpu": str(WIDE_CPU), "memory": "32Gi", "gpus": 0},
            "gpu": {"pods": gpu, "cpu": str(GPU_JOB_CPU), "memory": "64Gi", "gpus": 8}}


def job_body(name: str, shape: str, sizes: dict, namespace: str | None = None) -> dict:
    """A TrainJob of ``shape`` for the dispatcher, of the size ``sizes`` gives it."""
    size = sizes.get(shape) or {"pods": 1, "cpu": "2", "memory": "8Gi", "gpus": 0}
    resources: dict = {"requests": {"cpu": size["cpu"], "memory": size["memory"]}}
    spec: dict = {"managedBy": c.MANAGED_BY_MULTIKUEUE, "runtimeRef": {"name": RUNTIME},
                  "trainer": {"numNodes": size["pods"], "resourcesPerNode": resources}}
    if size["gpus"]:
        resources["requests"][GPU] = str(size["gpus"])
        resources["limits"] = {GPU: str(size["gpus"])}
        spec["podSpecOverrides"] = [{"targetJobs": [{"name": c.NODE}],
                                     "nodeSelector": {POOL_LABEL: "gpu"},
                                     "tolerations": [GPU_TOLERATION]}]
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": metadata, "spec": spec}


def _ms(values: list[float]) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"count": len(ordered), "p50_ms": round(percentile(ordered, 50) * 1000, 3),
            "p99_ms": round(percentile(ordered, 99) * 1000, 3),
            "max_ms": round(ordered[-1] * 1000, 3)}


def first_and_rest(logged: dict, first: tuple[str, str]) -> dict:
    """The first job of a shape (the decision that finds no kept heap of that shape)
    against the rest: its place step's wall and CPU ms beside theirs."""
    rest = [steps for key, steps in logged.items() if key != first]
    wall = [s["place"] for s in rest if "place" in s]
    cpu = [s["place_cpu"] for s in rest if "place_cpu" in s]
    steps = logged.get(first) or {}
    return {"first": {"place_wall_ms": _round_ms(steps.get("place")),
                      "place_cpu_ms": _round_ms(steps.get("place_cpu"))},
            "rest": {"place_wall": _ms(wall), "place_cpu": _ms(cpu) if cpu else None}}


def _round_ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def placements(env: BenchClusters, timelines: Timelines, workers: list[str],
               sizes: dict[str, dict], count: int, tag: str) -> dict:
    """``count`` jobs of each shape, one at a time (each deleted, its copy gone, before
    the next: every decision sees the same workers); each job's logged place step, and how
    busy the machine was meanwhile (a decision's wall time above its CPU time is its wait
    for a core)."""
    figures = {}
    custom = client.CustomObjectsApi(env.apis["manager"])
    for shape in SHAPES:
        namespace = f"scale-place-{tag}-{shape}"
        env.create_namespace(namespace, ["manager", *workers])
        missing = made = 0
        with CpuAccount(env.process_groups(workers)) as account:
            for index in range(count):
                if missing >= GIVE_UP_AFTER:
                    # A shape that does not fit would wait a minute per job: reported instead.
                    log.warning("placement of %s jobs: %d not dispatched; the rest skipped",
                                shape, missing)
                    break
                name = f"{shape}-{index:04d}"
                key = (namespace, name)
                writes.create(custom.api_client, c.TRAINER_GROUP, c.TRAINER_VERSION, namespace,
                              c.TRAINJOBS, job_body(name, shape, sizes))
                made += 1
                if timelines.wait_remotes({key}, 60):
                    missing += 1
                custom.delete_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION,
                                                       namespace, c.TRAINJOBS, name)
                # Its copy deleted and its finalizer lifted: the manager's object is gone.
                timelines.wait(lambda: set() if key in timelines.manager.deleted else {key}, 60)
        logged = dispatch_log.read(env.dispatcher.log_file, namespace)
        place = [steps["place"] for steps in logged.values() if "place" in steps]
        cpu = [steps["place_cpu"] for steps in logged.values() if "place_cpu" in steps]
        figures[shape] = {**sizes[shape], "jobs": made,
                          "missing": missing,
                          "logged": len(logged), "place_wall": _ms(place),
                          "place_cpu": _ms(cpu) if cpu else None,
                          **first_and_rest(logged, (namespace, f"{shape}-{0:04d}")),
                          "machine": account.figures()}
        log.info("placement of %s jobs (%d pods): p50 %s ms, p99 %s ms", shape,
                 sizes[shape]["pods"], figures[shape]["place_wall"]["p50_ms"],
                 figures[shape]["place_wall"]["p99_ms"])
    return figures


# --- a Pod event's way into the room placement reads ----------------------------------

def apply_buckets(dispatcher: ServiceProcess) -> dict[str, dict[float, float]] | None:
    """The dispatcher's ``dispatcher_capacity_event_apply_seconds`` and ``..._handler_
    seconds`` buckets now (name -> upper bound -> events at or under it, cumulative); None
    when it has no such histogram."""
    try:
        _, text = dispatcher.get("/metrics")
    except OSError:
        return None
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (APPLY_HISTOGRAM + "_bucket", HANDLER_HISTOGRAM + "_bucket"):
                buckets.setdefault(s.name[:-len("_bucket")], {})[float(s.labels["le"])] = \
                    s.value
    return buckets if APPLY_HISTOGRAM in buckets else None


def event_figures(before: dict | None, after: dict | None) -> dict | None:
    """``apply_figures`` of a Pod change's apply between two ``apply_buckets`` readings,
    with the capacity handler's own time as ``handler``."""
    if before is None or after is None:
        return None
    figures = apply_figures(before.get(APPLY_HISTOGRAM), after.get(APPLY_HISTOGRAM))
    figures["handler"] = apply_figures(before.get(HANDLER_HISTOGRAM),
                                       after.get(HANDLER_HISTOGRAM))
    return figures


def apply_figures(before: dict[float, float] | None,
                  after: dict[float, float] | None) -> dict | None:
    """The Pod changes counted between two readings of ``apply_buckets``: how many, p50
    and p99 in ms (within their bucket by linear interpolation, as Prometheus's
    ``histogram_quantile``; the last finite bound where it lies beyond), and the share
    within the 5 ms budget (a bucket's edge: exact)."""
    if before is None or after is None:
        return None
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if not total:
        return {"events": 0, "p50_ms": None, "p99_ms": None, "within_budget_share": None}

    def quantile(q: float) -> float:
        rank, lower, below = q * total, 0.0, 0.0
        for bound, count in zip(bounds, counts, strict=True):
            if count >= rank:
                if bound == float("inf"):
                    return lower
                inside = count - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, count
        return lower

    within = next((count for bound, count in zip(bounds, counts, strict=True)
                   if bound >= APPLY_MS / 1000), total)
    return {"events": int(total), "p50_ms": round(quantile(0.5) * 1000, 3),
            "p99_ms": round(quantile(0.99) * 1000, 3),
            "within_budget_share": round(within / total, 4)}


# --- churn -----------------------------------------------------------------------------

class Churn:
    """Per worker: every 1/``rate`` s (monotonic clock) a random workload Pod deleted
    (grace period 0) and a replacement created bound to the same Node."""

    def __init__(self, kubeconfig: Path, fleet: Fleet, rate: float, threads: int = 8,
                 seed: int = 7):
        self.kubeconfig = kubeconfig
        self.rate = rate
        self.pods = [p for p in fleet.pods if p["metadata"]["namespace"] == WORK_NAMESPACE]
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=f"churn-{fleet.worker}")
        self.slots = threading.Semaphore(threads * 2)
        self.stopping = threading.Event()
        self.done = self.errors = self.serial = 0
        self.clients: list[client.ApiClient] = []
        self.thread = threading.Thread(target=self._pace, daemon=True,
                                       name=f"churn-pacer-{fleet.worker}")

    def start(self) -> Churn:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def _api(self) -> client.ApiClient:
        api = getattr(self.local, "api", None)
        if api is None:
            api = self.local.api = api_client(self.kubeconfig)
            with self.lock:
                self.clients.append(api)
        return api

    def _pace(self) -> None:
        tick = 0
        while not self.stopping.is_set():
            delay = self.started + tick / self.rate - time.monotonic()
            if delay > 0 and self.stopping.wait(delay):
                return
            self.slots.acquire()
            self.pool.submit(self._replace)
            tick += 1

    def _replace(self) -> None:
        try:
            with self.lock:
                index = self.rng.randrange(len(self.pods))
                old = self.pods[index]
                self.serial += 1
                body = {**old, "metadata": {**old["metadata"],
                                            "name": f"churn-{self.serial:07d}"}}
                self.pods[index] = body
            api = self._api()
            meta = old["metadata"]
            try:
                writes.request_json(api, "DELETE", writes.object_path(
                    "", "v1", meta["namespace"], "pods", meta["name"]),
                    {"gracePeriodSeconds": 0})
            except ApiException as err:
                if err.status != 404:
                    raise
            writes.request_json(api, "POST", writes.object_path(
                "", "v1", meta["namespace"], "pods"), body)
            with self.lock:
                self.done += 1
        except Exception as err:  # noqa: BLE001 - counted and reported, the churn goes on
            with self.lock:
                self.errors += 1
            log.debug("churn: %s", err)
        finally:
            self.slots.release()

    def stop(self) -> dict:
        self.stopping.set()
        self.thread.join()
        self.pool.shutdown(wait=True)
        elapsed = time.monotonic() - self.started
        for api in self.clients:
            api.close()
        return {"target_per_second": self.rate, "replaced": self.done, "errors": self.errors,
                "seconds": round(elapsed, 1),
                "achieved_per_second": round(self.done / elapsed, 1) if elapsed else None}


def churn_cost(env: BenchClusters, window: float, churns: list[Churn]) -> dict:
    """The dispatcher's CPU per second over an idle window and over a churn window."""
    pid = env.dispatcher.proc.pid

    def measured() -> dict:
        with FootprintWindow(pid) as footprint:
            threading.Event().wait(window)  # a measurement window
        return footprint.figures()

    idle = measured()
    for churn in churns:
        churn.start()
    threading.Event().wait(min(2.0, window))  # the churn under way before it is measured
    replaced = sum(churn.done for churn in churns)
    churning = measured()
    replaced = sum(churn.done for churn in churns) - replaced
    idle_rate = idle["cpu_seconds"] / idle["wall_seconds"]
    churn_rate = churning["cpu_seconds"] / churning["wall_seconds"]
    cost = churn_rate - idle_rate
    return {"window_seconds": window, "idle": idle, "churn": churning,
            "idle_cpu_per_second": round(idle_rate, 4),
            "churn_cpu_per_second": round(churn_rate, 4),
            "cost_cpu_per_second": round(cost, 4),
            # Pods replaced (a delete and a create, so two Pod events and more) in the
            # window, all workers: the cost per Pod says what a faster churn would cost.
            "window_replaced_per_second": round(replaced / churning["wall_seconds"], 1),
            "cpu_ms_per_pod_replaced": round(cost * churning["wall_seconds"] / replaced * 1000,
                                             3) if replaced else None}


class Reaper:
    """Deletes each job of ``namespace`` on the manager as soon as its copy is seen on a
    worker, as if jobs ended at the rate they arrive: without an operator a copy never
    gets pods, so its reservation would stay and make every later placement dearer."""

    def __init__(self, env: BenchClusters, timelines: Timelines, namespace: str,
                 threads: int = 4):
        self.timelines = timelines
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api_client(env.kubeconfig("manager")))
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="reaper")
        self.stopping = threading.Event()
        self.reaped: set = set()
        self.thread = threading.Thread(target=self._run, daemon=True, name="reaper")

    def start(self) -> Reaper:
        self.thread.start()
        return self

    def _run(self) -> None:
        timelines = self.timelines
        while not self.stopping.is_set():
            with timelines.changed:
                timelines.changed.wait(0.2)
                ready = [key for key in timelines.manager.added
                         if key[0] == self.namespace and key not in self.reaped
                         and timelines.remote(key) is not None]
                self.reaped.update(ready)
            for key in ready:
                self.pool.submit(self._delete, key[1])

    def _delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, self.namespace, c.TRAINJOBS, name)
        except ApiException as err:
            if err.status != 404:
                log.warning("reaper: deleting %s/%s: %s", self.namespace, name, err.reason)

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join()
        self.pool.shutdown(wait=True)
        self.custom.api_client.close()
        return len(self.reaped)


def dispatcher_writes(env: BenchClusters, namespace: str) -> dict:
    """The dispatcher's two timed writes of each dispatch of ``namespace`` (its log): the
    placement PATCH and the copy's create, ms, beside the floor's."""
    logged = dispatch_log.read(env.dispatcher.log_file, namespace).values()
    return {step: summary_ms([s[step] for s in logged if step in s])
            for step in (dispatch_log.QUEUE, *dispatch_log.WRITES)}


def drop_jobs(env: BenchClusters, timelines: Timelines, namespace: str,
              workers: list[str]) -> None:
    """Delete a step's jobs as a user would (their manager namespace, the dispatcher
    running: it removes the copies), then the workers' namespaces."""
    core = client.CoreV1Api(env.apis["manager"])
    try:
        core.delete_namespace(namespace)
    except ApiException as err:
        if err.status != 404:
            raise
    _wait(f"namespace {namespace} gone from the manager", lambda: (
        namespace not in [n["metadata"]["name"] for n in
                          _listed(env.apis["manager"], "/api/v1/namespaces", [])["items"]],
        namespace), 600)
    for worker in workers:
        try:
            client.CoreV1Api(env.apis[worker]).delete_namespace(namespace)
        except ApiException as err:
            if err.status != 404:
                raise
    if namespace in env.namespaces:
        env.namespaces.remove(namespace)
    timelines.forget(namespace)


# --- the run ---------------------------------------------------------------------------

def budgets(results: dict) -> list[dict]:
    """The budgets at the full size: measured value and whether met (None: not measured)."""
    full = (results.get("sizes") or [{}])[-1]
    rows = []

    def row(name, value, unit, limit, met, op="<"):
        rows.append({"budget": name, "measured": value, "unit": unit, "limit": limit,
                     "op": op, "met": met})

    start = (full.get("memory") or {}).get("with_pods") or {}
    peaks = [x for x in (start.get("peak_rss_mb"),
                         (results.get("dispatcher_at_end") or {}).get("peak_rss_mb"))
             if x is not None]
    peak = max(peaks) if peaks else None
    workers = results.get("workers")
    row(f"dispatcher RSS with {workers} workers of this size (peak, the churn and the "
        f"arrivals included; settled after its start {start.get('settled_rss_mb')} MB)",
        peak, "MB", 600,
        None if peak is None else peak < 600)
    synced = start.get("start_to_synced_seconds")
    gauge = start.get("gauge_seconds")
    if gauge:
        synced = max(synced or 0, *gauge.values())
    row("start to every worker's caches synced", synced, "s", 60,
        None if synced is None else synced < 60)
    p99s = [s["place_wall"]["p99_ms"] for s in (full.get("placement") or {}).values()
            if s["place_wall"]["p99_ms"] is not None]
    worst = max(p99s) if p99s else None
    row("one placement decision, p99 (worst shape)", worst, "ms", 20,
        None if worst is None else worst < 20)
    steady = {s["rate"]: s for s in results.get("steady_churn") or []}
    top = steady.get(50) or (steady[max(steady)] if steady else None)
    p99 = top["latency"]["p99_ms"] if top else None
    row(f"dispatch p99 at {top['rate'] if top else 50} jobs/s during churn", p99, "ms", 100,
        None if p99 is None else p99 < 100)
    cost = (results.get("churn") or {}).get("cost_cpu_per_second")
    row("CPU following the churn", cost, "CPU s/s", 0.1,
        None if cost is None else cost < 0.1)
    for item in results.get("against_floor") or []:
        ratio = item["ratio_p99"]
        row(f"dispatch p99 at {item['rate']} jobs/s during churn, against the floor's "
            f"({_or_na(item['dispatcher']['p99_ms'])} / {_or_na(item['floor']['p99_ms'])} ms)",
            ratio, "x the floor", FLOOR_RATIO, None if ratio is None else ratio <= FLOOR_RATIO,
            op="<=")
    applied = [s["event_apply"] for s in steady.values() if s.get("event_apply")
               and s["event_apply"]["events"]]
    worst = max(applied, key=lambda a: a["p99_ms"]) if applied else None
    row("a Pod event to its room counted, p99 while placements run (worst rate; share "
        f"within {APPLY_MS:g} ms {_or_na(worst and worst['within_budget_share'])})",
        worst and worst["p99_ms"], "ms", APPLY_MS,
        None if worst is None else worst["within_budget_share"] >= 0.99)
    wide = (full.get("placement") or {}).get("wide") or {}
    wide_cpu = (wide.get("place_cpu") or {}).get("p99_ms")
    row(f"placement CPU p99, a {wide.get('pods', '?')}-pod job at "
        f"{full.get('nodes_per_worker', '?')} Nodes", wide_cpu, "ms", WIDE_CPU_MS,
        None if wide_cpu is None else wide_cpu < WIDE_CPU_MS)
    ratios = {}
    for shape, item in (full.get("placement") or {}).items():
        first = (item.get("first") or {}).get("place_cpu_ms")
        rest = ((item.get("rest") or {}).get("place_cpu") or {}).get("p99_ms")
        if first is not None and rest:
            ratios[shape] = round(first / rest, 2)
    shape = max(ratios, key=ratios.get) if ratios else None
    row("the first job of a shape against the rest's p99, placement CPU (worst shape"
        + (f": {shape})" if shape else ")"), ratios.get(shape), "x the rest", 1.0,
        None if shape is None else ratios[shape] <= 1.0, op="<=")
    return rows


def _or_na(value) -> str:
    return "n/a" if value is None else f"{value:g}"


def against_floor(steady: list[dict], floors: list[dict]) -> list[dict]:
    """Per rate: the dispatcher's latency percentiles beside the floor's, and the
    ratios."""
    rows = []
    by_rate = {f["rate"]: f for f in floors}
    for step in steady:
        under = by_rate.get(step["rate"])
        if under is None:
            continue
        mine, base = step["latency"], under["latency"]

        def ratio(q: str) -> float | None:
            return round(mine[q] / base[q], 2) if mine[q] is not None and base[q] else None

        rows.append({"rate": step["rate"],
                     "dispatcher": {k: mine[k] for k in ("p50_ms", "p99_ms")},
                     "floor": {k: base[k] for k in ("p50_ms", "p99_ms")},
                     "ratio_p50": ratio("p50_ms"), "ratio_p99": ratio("p99_ms")})
    return rows


def run_scale(settings: BenchSettings, output: Path, state_dir: Path | None,
              results: dict) -> None:
    """The scale suite into ``results`` (filled as figures come)."""
    log_dir = output / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    reuse = state_dir is not None
    state = state_dir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    env = BenchClusters(state, settings.scale_workers, log_dir, reuse=reuse,
                        dispatcher_args=settings.dispatcher_args)
    timelines: Timelines | None = None
    runner: LoadRunner | None = None
    churns: list[Churn] = []
    policy = settings.placement_policy
    sizes = [*settings.scale_axis, (settings.scale_nodes, settings.scale_pods)]
    results.update({"suite": "scale", "workers": settings.scale_workers, "sizes": [],
                    "note": "no training operator runs on the scale workers: a job is "
                            "dispatched when its copy exists there; the copies get no pods"})
    try:
        started = time.monotonic()
        env.up()
        workers = env.worker_names
        for worker in workers:
            # The environment's one huge Node would take every placement; the fleet
            # replaces it.
            fixtures.remove_node(env.apis[worker], f"{worker}-bench")
            fixtures.install_runtime(env.apis[worker], runtime())
        results["environment"].update({**describe(env, settings),
                                       "harness_up_seconds": round(time.monotonic() - started, 1)})
        timelines = Timelines({name: env.kubeconfig(name) for name in env.names}).start()
        for index, (nodes, pods) in enumerate(sizes):
            last = index == len(sizes) - 1
            step_started = time.monotonic()
            fleets = [build_fleet(w, nodes, pods) for w in workers]
            size: dict = {"nodes_per_worker": nodes, "pods_per_worker": pods,
                          "gpu_nodes_per_worker": sum(n.pool == "gpu" for n in fleets[0].nodes)}
            results["sizes"].append(size)
            log.info("scale: %d workers of %d Nodes and %d Pods", len(workers), nodes, pods)
            size["memory"] = memory(env, workers, policy, fleets, settings.scale_create_threads)
            sizes_of = shapes(fleets)
            if last:
                size["takeover"] = takeover(env, timelines, workers, policy)
            size["placement"] = placements(env, timelines, workers, sizes_of,
                                           settings.scale_placement_jobs, str(index))
            if last:
                runner = LoadRunner(settings.concurrency)
                ctx = scenarios.BenchContext(env, timelines, runner, settings, output)
                churns = [Churn(env.kubeconfig(f.worker), f, settings.scale_churn_rate,
                                seed=i) for i, f in enumerate(fleets)]
                before = apply_buckets(env.dispatcher)
                results["churn"] = churn_cost(env, settings.scale_window_seconds, churns)
                # The churn alone, no placement running: what a Pod change costs to count.
                results["churn"]["event_apply"] = event_figures(before,
                                                                apply_buckets(env.dispatcher))
                results["steady_churn"] = []
                results["floor"] = []
                threads = floor.reconcile_threads(settings.dispatcher_args)
                for rate in settings.scale_rates:
                    namespace = f"scale-rate-{rate}"
                    reaper = Reaper(env, timelines, namespace).start()
                    before = apply_buckets(env.dispatcher)
                    try:
                        figures = scenarios.steady(ctx, rate, workers,
                                                   seconds=settings.scale_rate_seconds,
                                                   namespace=namespace, repeats=1,
                                                   settle=False)
                    finally:
                        figures_reaped = reaper.stop()
                    figures["event_apply"] = event_figures(before, apply_buckets(env.dispatcher))
                    figures["writes"] = dispatcher_writes(env, namespace)
                    figures.pop("runs", None)
                    figures["deleted_once_copied"] = figures_reaped
                    results["steady_churn"].append(figures)
                    drop_jobs(env, timelines, namespace, workers)
                    # The floor at the same rate, on the same fleet, the churn going on.
                    namespace = f"scale-floor-{rate}"
                    env.create_namespace(namespace, ["manager", *workers])
                    results["floor"].append(floor.measure(
                        {name: env.kubeconfig(name) for name in env.names}, timelines, runner,
                        workers, rate, settings.scale_rate_seconds, threads, namespace,
                        env.process_groups(workers)))
                    drop_jobs(env, timelines, namespace, workers)
                results["against_floor"] = against_floor(results["steady_churn"],
                                                         results["floor"])
                results["churn"]["drivers"] = {f.worker: churn.stop()
                                               for f, churn in zip(fleets, churns, strict=True)}
                churns = []
            size["seconds"] = round(time.monotonic() - step_started, 1)
            if not last:
                env.stop_dispatcher()
                size["emptied"] = empty(env, workers)
        # The dispatcher that ran the last steps (the standby that took over): its peak
        # over its whole life, the churn and the arrivals included.
        pid = env.dispatcher.proc.pid
        results["dispatcher_at_end"] = {"rss_mb": round(rss_bytes(pid) / 2**20, 1),
                                        "peak_rss_mb": round(peak_rss_bytes(pid) / 2**20, 1)}
        results["budgets"] = budgets(results)
    finally:
        for churn in churns:
            churn.stop()
        if runner is not None:
            runner.close()
        if timelines is not None:
            timelines.stop()
        env.close()
