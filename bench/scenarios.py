"""The scenarios. Each returns a JSON-ready dict of figures; per-job times come from the
benchmark's own watches (manager TrainJob ADDED -> remote ADDED on a worker)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from bench import apicost, dispatch_log, steps, sync_log
from bench import repeats as repeats_
from bench.environment import BenchClusters
from bench.footprint import CpuAccount, FootprintWindow, cpu_sum
from bench.load import LoadRunner, creates
from bench.settings import BenchSettings
from bench.stats import summary_ms
from bench.timeline import Key, Timelines
from controller_kit.api_time import format_time
from trainjob import constants as c

log = logging.getLogger(__name__)

TRAINJOBS = f"{c.TRAINJOBS}.{c.TRAINER_GROUP}"
EVENTS = "events"
# What running a copy writes on its worker: the operator's JobSet, JobSet's Jobs, the Job
# controller's pods, the scheduler's bindings and kwok's pod status (subresources included).
RUNNING_RESOURCES = (f"{c.JOBSETS}.{c.JOBSET_GROUP}", "jobs.batch", "pods")


@dataclass
class BenchContext:
    env: BenchClusters
    timelines: Timelines
    runner: LoadRunner
    settings: BenchSettings
    output: Path

    def kubeconfig(self, cluster: str) -> Path:
        return self.env.kubeconfig(cluster)

    @property
    def dispatcher_pid(self) -> int:
        return self.env.dispatcher.proc.pid

    @property
    def controller_pid(self) -> int:
        """The process that dispatches: ours when it runs, else the manager's Kueue."""
        if self.env.dispatcher is not None:
            return self.dispatcher_pid
        return self.env.process_groups([])["kueue manager"][0]


def job_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(count)]


def _wait_timeout(count: int) -> float:
    """How long a step waits for its ``count`` jobs' copies after the last create."""
    return 120 + count / 5


def short_wait(count: int) -> float:
    """The comparison's shorter wait: Kueue's own dispatchers copy about a job a second,
    so a longer wait only adds jobs at the same rate (and the run's length)."""
    return 60 + count / 8


def _snapshot(env: BenchClusters, clusters: list[str]) -> dict[str, Counter]:
    return {name: apicost.request_counts(env.control_plane(name)) for name in clusters}


def _webhook_snapshot(env: BenchClusters, clusters: list[str]) -> dict[str, Counter]:
    return {name: apicost.webhook_time(env.control_plane(name)) for name in clusters}


def _webhook_cost(before: dict[str, Counter], after: dict[str, Counter], count: int,
                  workers: list[str]) -> dict:
    """The apiservers' time in admission webhooks (Kueue's, JobSet's, the operators') per
    job: a request waits for them before it is stored, so under load they set the pace."""
    def summed(snap):
        return sum((snap[w] for w in workers), Counter())
    return {"manager": apicost.webhook_cost(before["manager"], after["manager"], count),
            "workers": apicost.webhook_cost(summed(before), summed(after), count)}


def _settled(env: BenchClusters, clusters: list[str], quiet: float = 1.0,
             timeout: float = 20.0) -> dict[str, Counter]:
    """Snapshots once TrainJob and Event writes have stopped changing for ``quiet`` seconds
    (the dispatcher's trailing writes, e.g. Events, land after the remote exists)."""
    def writes(snap):
        return {name: (apicost.total(counts, resource=TRAINJOBS, verbs=apicost.WRITE_VERBS),
                       apicost.total(counts, resource=EVENTS, verbs=apicost.WRITE_VERBS))
                for name, counts in snap.items()}

    deadline = time.monotonic() + timeout
    last = _snapshot(env, clusters)
    while time.monotonic() < deadline:
        threading.Event().wait(quiet)
        now = _snapshot(env, clusters)
        if writes(now) == writes(last):
            return now
        last = now
    return last


def _dispatched(ctx: BenchContext, keys: list[Key]) -> dict:
    """Per-job latencies (``by_job``), throughput basis and where the jobs went, from the
    timelines."""
    by_job, ends, placements = {}, [], Counter()
    for key in keys:
        start = ctx.timelines.manager.added.get(key)
        remote = ctx.timelines.remote(key)
        if start is None or remote is None:
            continue
        worker, seen = remote
        by_job[key] = max(0.0, seen - start)
        ends.append(seen)
        placements[worker] += 1
    return {"by_job": by_job, "last_remote": max(ends) if ends else None,
            "placements": dict(sorted(placements.items()))}


# py-spy's views of a process: on-CPU stacks of the thread holding the GIL (what costs
# CPU), and every thread's stack whether running or waiting (where wall time goes).
PROFILE_VIEWS = {"gil": ("--gil",), "wall": ("--idle",)}


@contextlib.contextmanager
def _profiled(pid: int, path: Path | None, enabled: bool, views: tuple[str, ...] = ()):
    """py-spy record of ``pid`` while the block runs, when enabled: a flame graph SVG at
    ``path``, or for each of ``views`` collapsed stacks (``<path stem>-<view>.txt``, one
    line per stack with its sample count) that flame graph tools and a text search read."""
    tool = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not enabled or path is None:
        yield None
        return
    if not Path(tool).exists():
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    runs = [(path, "flamegraph", ())] if not views else [
        (path.with_name(f"{path.stem}-{view}.txt"), "raw", PROFILE_VIEWS[view])
        for view in views]
    recorders = [subprocess.Popen([tool, "record", "--pid", str(pid), "--rate", "100",
                                   "--output", str(out), "--format", fmt, "--nonblocking",
                                   *flags],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for out, fmt, flags in runs]
    try:
        yield path
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
        for recorder in recorders:
            try:
                recorder.wait(60)
            except subprocess.TimeoutExpired:
                recorder.kill()
                recorder.wait()


# --- the ceiling ---------------------------------------------------------------------------

def create_ceiling(ctx: BenchContext, count: int | None = None) -> dict:
    """How fast a plain client creates ``count`` TrainJobs (default the burst's) on the
    manager and on one worker, with the burst's concurrency (no dispatcher running)."""
    count = count or ctx.settings.burst_jobs
    figures = {}
    for cluster in ("manager", "worker-1"):
        namespace = f"bench-ceiling-{cluster}"
        ctx.env.create_namespace(namespace, [cluster])
        # Untimed warm-up: every load thread's client connected, the apiserver's TrainJob
        # storage and admission paths exercised once.
        ctx.runner.run(creates(ctx.kubeconfig(cluster), namespace,
                               job_names("warm-up", 2 * ctx.settings.concurrency),
                               multikueue=False))
        run = ctx.runner.run(creates(ctx.kubeconfig(cluster), namespace,
                                     job_names("ceiling", count), multikueue=False))
        figures[cluster] = {"jobs": count, "creates_per_second": round(run.rate(), 1),
                            "seconds": round(run.last_end - run.first_start, 2),
                            "retries": run.retries}
        log.info("ceiling on %s: %.1f creates/s", cluster, run.rate())
    ctx.env.remove_namespaces([f"bench-ceiling-{n}" for n in ("manager", "worker-1")])
    for cluster in ("manager", "worker-1"):
        ctx.timelines.forget(f"bench-ceiling-{cluster}")
    figures["concurrency"] = ctx.settings.concurrency
    figures["limit_creates_per_second"] = min(figures["manager"]["creates_per_second"],
                                              figures["worker-1"]["creates_per_second"])
    return figures


# --- bursts ----------------------------------------------------------------------------------

def burst(ctx: BenchContext, namespace: str, count: int, workers: list[str], *,
          api_cost: bool = False, profile: Path | None = None, submit=None,
          wait=_wait_timeout) -> dict:
    """``count`` jobs created on the manager as fast as the load pool goes; throughput from
    the first create to the last remote seen, latency per job, the dispatching process's
    footprint and (``api_cost``) the apiservers' request deltas. ``submit`` shapes each job
    for the dispatcher under test (default: this one's ``managedBy``); ``wait(count)`` is
    how long copies are waited for after the last create."""
    env = ctx.env
    env.create_namespace(namespace, ["manager", *workers])
    names = job_names("job", count)
    keys = [(namespace, n) for n in names]
    clusters = ["manager", *workers]
    before = _snapshot(env, clusters) if api_cost else None
    hooks_before = _webhook_snapshot(env, clusters) if api_cost else None
    with _profiled(ctx.controller_pid, profile, profile is not None), \
            CpuAccount(env.process_groups(workers)) as cpu, \
            FootprintWindow(ctx.controller_pid) as window:
        run = ctx.runner.run(creates(ctx.kubeconfig("manager"), namespace, names,
                                     submit=submit))
        missing = ctx.timelines.wait_remotes(set(keys), wait(count))
        # Where operators run the copies: until each copy's pods have all run.
        not_running = _wait_running(ctx, keys)
    seen = _dispatched(ctx, keys)
    latencies = list(seen["by_job"].values())
    span = (seen["last_remote"] - run.first_start) if seen["last_remote"] else None
    figures = {
        "namespace": namespace, "jobs": count, "workers": len(workers),
        "dispatched": len(latencies), "missing": len(missing),
        "create_seconds": round(run.last_end - run.first_start, 2),
        "create_rate": round(run.rate(), 1), "create_retries": run.retries,
        "seconds": round(span, 2) if span else None,
        "throughput_jobs_per_second": round(len(latencies) / span, 1) if span else 0.0,
        "latency": summary_ms(latencies),
        "latency_samples_ms": [round(x * 1000, 1) for x in latencies],
        "placements": seen["placements"],
        "dispatcher": window.figures(),
        # Where the machine's CPU went meanwhile: every process here shares it.
        "cpu": cpu.figures(),
    }
    if ctx.timelines.pods:
        figures["running_latency"] = summary_ms(
            [running - ctx.timelines.manager.added[key] for key in keys
             if (running := ctx.timelines.running(key)) is not None
             and key in ctx.timelines.manager.added])
        figures["dispatched_never_running"] = len(not_running)
    if profile is not None:
        figures["profile"] = profile.name
    if api_cost:
        figures["api"] = _api_cost(before, _settled(env, clusters), count, workers)
        figures["api"]["webhooks"] = _webhook_cost(
            hooks_before, _webhook_snapshot(env, clusters), count, workers)
    log.info("burst of %d on %d workers: %.1f jobs/s, p99 %s ms", count, len(workers),
             figures["throughput_jobs_per_second"], figures["latency"]["p99_ms"])
    return figures


def _wait_running(ctx: BenchContext, keys: list[Key]) -> set[Key]:
    """When pods are watched (operators run the copies): wait until every dispatched job's
    pods have all run; the jobs whose pods did not, after a timeout that grows with them."""
    if not ctx.timelines.pods:
        return set()
    placed = {key for key in keys if ctx.timelines.remote(key) is not None}
    return ctx.timelines.wait(
        lambda: {key for key in placed if ctx.timelines.running(key) is None},
        60 + len(placed) / 10)


def _api_cost(before: dict[str, Counter], after: dict[str, Counter], count: int,
              workers: list[str]) -> dict:
    deltas = {name: apicost.delta(before[name], after[name]) for name in after}
    manager = deltas["manager"]
    # The benchmark's own creates are the only manager TrainJob POSTs it makes meanwhile.
    manager_tj_writes = apicost.total(manager, resource=TRAINJOBS,
                                      verbs=apicost.WRITE_VERBS) - count
    worker_tj_writes = sum(apicost.total(deltas[w], resource=TRAINJOBS,
                                         verbs=apicost.WRITE_VERBS) for w in workers)
    event_writes = apicost.total(manager, resource=EVENTS, verbs=apicost.WRITE_VERBS)

    def reads(name: str) -> int:
        # Resource reads only: discovery and other non-resource URLs have no resource.
        return sum(n for (res, _, verb), n in deltas[name].items()
                   if res and verb in ("GET", "LIST"))

    return {
        "per_job": {
            "manager_trainjob_writes": round(manager_tj_writes / count, 3),
            "manager_trainjob_patches": round(apicost.total(
                manager, resource=TRAINJOBS, verbs=frozenset({"PATCH"})) / count, 3),
            "worker_trainjob_writes": round(worker_tj_writes / count, 3),
            "worker_trainjob_creates": round(sum(apicost.total(
                deltas[w], resource=TRAINJOBS, verbs=frozenset({"POST"}))
                for w in workers) / count, 3),
            # Copies withdrawn or removed within the burst (AllAtOnce's losing copies, a
            # finished copy's deletion), before the step's own deletion.
            "worker_trainjob_deletes": round(sum(apicost.total(
                deltas[w], resource=TRAINJOBS, verbs=frozenset({"DELETE"}))
                for w in workers) / count, 3),
            "dispatch_writes": round((manager_tj_writes + worker_tj_writes) / count, 3),
            "manager_event_writes": round(event_writes / count, 3),
            "manager_reads": round(reads("manager") / count, 3),
            "worker_reads": round(sum(reads(w) for w in workers) / count, 3),
            # Every resource, for dispatchers that write more than TrainJobs (Kueue's
            # Workloads, its copies' Workloads, status and Events).
            "manager_writes_all": round((apicost.total(manager, verbs=apicost.WRITE_VERBS)
                                         - count) / count, 3),
            "worker_writes_all": round(sum(apicost.total(deltas[w], verbs=apicost.WRITE_VERBS)
                                           for w in workers) / count, 3),
            # Of those, what running a copy costs, whoever dispatched it (operators run it).
            "worker_writes_running": round(sum(
                apicost.total(deltas[w], resource=resource, verbs=apicost.WRITE_VERBS)
                for w in workers for resource in RUNNING_RESOURCES) / count, 3),
        },
        # Each apiserver's writes of every resource (the manager's without the benchmark's
        # own creates): where a dispatcher's copies land, and which apiserver bounds it.
        "writes_per_job_by_apiserver": {
            name: round((apicost.total(deltas[name], verbs=apicost.WRITE_VERBS)
                         - (count if name == "manager" else 0)) / count, 3)
            for name in ["manager", *workers]},
        "note": "manager TrainJob writes exclude the benchmark's own creates; reads are GET "
                "and LIST of every resource (watches excluded) over the whole burst",
        "requests": {name: apicost.as_table(d) for name, d in deltas.items()},
    }


def idle(ctx: BenchContext, mirrored: int) -> dict:
    """The dispatcher's footprint while nothing happens, with ``mirrored`` jobs placed:
    measured once what the previous scenario left (its Events, the apiservers' catching
    up) is done."""
    settled = repeats_.settle(ctx.env.dispatcher)
    with FootprintWindow(ctx.dispatcher_pid) as window:
        threading.Event().wait(ctx.settings.idle_seconds)
    return {"mirrored_jobs": mirrored, **window.figures(), "settle": settled}


def _steps(ctx: BenchContext) -> steps.Snapshot | None:
    """The running dispatcher's step histograms (None when this dispatcher is not running,
    e.g. a Kueue contender)."""
    return steps.snapshot(ctx.env.dispatcher) if ctx.env.dispatcher is not None else None


# --- steady arrival --------------------------------------------------------------------------

def steady(ctx: BenchContext, rate: int, workers: list[str], *, seconds: float | None = None,
           namespace: str | None = None, submit=None, wait=_wait_timeout,
           repeats: int | None = None, settle: bool = True) -> dict:
    """Jobs arriving at ``rate`` per second for ``seconds`` (default the settings', long
    enough for their ``step_samples``), ``repeats`` times (default the settings'), each
    after the machine settled (``settle``): latency percentiles over all the repeats'
    samples, with their spread (copies waited for ``wait(count)`` after the last create)."""
    seconds = seconds or max(ctx.settings.rate_seconds, ctx.settings.step_samples / rate)
    repeats = repeats or ctx.settings.repeats
    base = namespace or f"bench-rate-{rate}"
    ctx.runner.warm([ctx.kubeconfig("manager")])
    before = _steps(ctx)
    with FootprintWindow(ctx.controller_pid) as window:
        runs = repeats_.run_repeats(
            lambda index: _steady_once(ctx, rate, workers, seconds,
                                       base if repeats == 1 else f"{base}-{index + 1}",
                                       submit, wait, profile=index == 0),
            repeats, ctx.env.dispatcher, settle)
    samples = [x for run in runs for x in run["samples"]]
    slowest = dispatch_log.slowest({k: v for run in runs for k, v in run["by_job"].items()},
                                   {k: v for run in runs for k, v in run["logged"].items()})
    figures = {
        "rate": rate, "seconds": seconds, "repeats": repeats,
        "jobs": sum(run["jobs"] for run in runs),
        "achieved_arrival_rate": statistics.median(
            run["achieved_arrival_rate"] or 0.0 for run in runs),
        "dispatched": len(samples), "missing": sum(run["missing"] for run in runs),
        "latency": repeats_.percentiles(runs, "samples"),
        "latency_samples_ms": [round(x * 1000, 1) for x in samples],
        "runs": [{"namespace": run["namespace"], "latency": summary_ms(run["samples"]),
                  "achieved_arrival_rate": run["achieved_arrival_rate"],
                  "missing": run["missing"], "settle": run["settle"], "cpu": run["cpu"]}
                 for run in runs],
        "dispatcher": window.figures(),
        # The slowest 1% of the dispatches, split by the dispatcher's log of each.
        "slowest": slowest,
        # Where the machine's CPU went while jobs arrived (settling excluded).
        "cpu": cpu_sum([run["cpu"] for run in runs]),
    }
    if before is not None:
        after = _steps(ctx)
        figures["steps"] = {action: steps.breakdown(before, after, action)
                            for action in ("Place", steps.GC)}
    log.info("steady %d jobs/s: p50 %s ms, p99 %s ms (%d repeats)", rate,
             figures["latency"]["p50_ms"], figures["latency"]["p99_ms"], repeats)
    return figures


def _steady_once(ctx: BenchContext, rate: int, workers: list[str], seconds: float,
                 namespace: str, submit, wait, profile: bool) -> dict:
    ctx.env.create_namespace(namespace, ["manager", *workers])
    count = max(1, int(rate * seconds))
    names = job_names("job", count)
    keys = [(namespace, n) for n in names]
    path = ctx.output / f"profile-steady-{rate}"
    with _profiled(ctx.controller_pid, path, ctx.settings.profile and profile,
                   ("gil", "wall")), CpuAccount(ctx.env.process_groups(workers)) as cpu:
        run = ctx.runner.run(creates(ctx.kubeconfig("manager"), namespace, names,
                                     submit=submit), rate=rate)
        missing = ctx.timelines.wait_remotes(set(keys), wait(count))
    arrival_span = max(run.starts) - run.first_start
    dispatched = _dispatched(ctx, keys)
    return {"namespace": namespace, "jobs": count, "missing": len(missing),
            "cpu": cpu.figures(),
            "samples": list(dispatched["by_job"].values()), "by_job": dispatched["by_job"],
            "logged": _logged_steps(ctx, namespace, set(dispatched["by_job"])),
            "achieved_arrival_rate": round((count - 1) / arrival_span, 1)
            if arrival_span else None}


def _logged_steps(ctx: BenchContext, namespace: str, keys: set[Key],
                  timeout: float = 10.0) -> dict[Key, dict[str, float]]:
    """The dispatcher's logged steps of each of ``keys``: nothing where it created no copy
    (a contender, or the dispatcher in Kueue mode). It logs a copy's creation once the
    create is answered, which may be just after the benchmark's watch saw the copy: wait
    for every line, up to ``timeout``."""
    dispatcher = ctx.env.dispatcher
    if dispatcher is None:
        return {}
    deadline = time.monotonic() + timeout
    while True:
        logged = dispatch_log.read(dispatcher.log_file, namespace)
        if not logged:
            return {}  # the copies were not this dispatcher's to create (Kueue mode)
        if keys <= logged.keys() or time.monotonic() > deadline:
            if not keys <= logged.keys():
                log.warning("the dispatcher logged the steps of %d of %d jobs in %s",
                            len(keys & logged.keys()), len(keys), namespace)
            return logged
        threading.Event().wait(0.2)


# --- status sync -----------------------------------------------------------------------------

SYNC_CONDITION = "Created"


def _status_flip(namespace: str, name: str, reason: str):
    now = format_time()
    body = {"status": {
        "conditions": [{"type": SYNC_CONDITION, "status": "True", "reason": reason,
                        "message": "JobSet created (status written by the benchmark)",
                        "lastTransitionTime": now}],
        "jobsStatus": [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0,
                        "active": 1, "suspended": 0}],
    }}

    def call(custom: client.CustomObjectsApi) -> object:
        return custom.patch_namespaced_custom_object_status(
            c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name, body,
            _content_type="application/merge-patch+json", _preload_content=False)
    return call


def status_sync(ctx: BenchContext, keys: list[Key], workers: list[str]) -> dict:
    """Write each remote's status as the operator would (one write per job, paced) and time
    the manager object showing it; the settings' ``repeats`` times, each after the machine
    settled, each repeat a status with a reason of its own."""
    env = ctx.env
    placed = [(key, ctx.timelines.remote(key)) for key in keys]
    placed = [(key, where[0]) for key, where in placed if where is not None]
    clusters = ["manager", *workers]
    ctx.runner.warm([ctx.kubeconfig(worker) for worker in workers])
    before = _snapshot(env, clusters)
    steps_before = _steps(ctx)
    relists_before = _relists(ctx)
    runs = repeats_.run_repeats(
        lambda index: _sync_once(ctx, placed, workers, f"JobSetCreated{index + 1}",
                                 profile=index == 0),
        ctx.settings.repeats, ctx.env.dispatcher)
    after = _settled(env, clusters)
    manager_delta = apicost.delta(before["manager"], after["manager"])
    status_writes = apicost.total(manager_delta, resource=TRAINJOBS, verbs=apicost.WRITE_VERBS)
    changes = len(placed) * len(runs)
    lags = [x for run in runs for x in run["lags"]]
    figures = {
        "jobs": len(placed), "rate": ctx.settings.sync_rate, "repeats": len(runs),
        "synced": len(lags), "missing": sum(run["missing"] for run in runs),
        "lag": repeats_.percentiles(runs, "lags"),
        "lag_samples_ms": [round(x * 1000, 1) for x in lags],
        "lag_from_remote_watch": summary_ms([x for run in runs for x in run["watch_lags"]]),
        "runs": [{"lag": summary_ms(run["lags"]), "missing": run["missing"],
                  "settle": run["settle"], "cpu": run["cpu"]} for run in runs],
        "cpu": cpu_sum([run["cpu"] for run in runs]),
        "manager_trainjob_writes": status_writes,
        "manager_writes_per_status_change": round(status_writes / changes, 3)
        if changes else None,
        "manager_requests": apicost.as_table(manager_delta),
    }
    if steps_before is not None:
        after = _steps(ctx)
        figures["steps"] = {action: steps.breakdown(steps_before, after, action)
                            for action in ("CopyStatus", steps.GC)}
        figures["relists"] = {f"{cluster}/{resource}": count - relists_before.get(
            (cluster, resource), 0) for (cluster, resource), count in _relists(ctx).items()
            if count != relists_before.get((cluster, resource), 0)}
        figures["slowest"] = _sync_slowest(ctx, runs)
    log.info("status sync of %d: p50 %s ms, p99 %s ms, %s manager writes each", len(placed),
             figures["lag"]["p50_ms"], figures["lag"]["p99_ms"],
             figures["manager_writes_per_status_change"])
    return figures


def _relists(ctx: BenchContext) -> dict[tuple[str, str], float]:
    """The running dispatcher's relists per cache (empty when none runs)."""
    return steps.relists(ctx.env.dispatcher) if ctx.env.dispatcher is not None else {}


def _sync_slowest(ctx: BenchContext, runs: list[dict]) -> dict | None:
    """The slowest 1 % of the sync's changes split by where their time went, from the
    dispatcher's log (``bench.sync_log``)."""
    namespaces = {key[0] for run in runs for key, _, _ in run["changes"]}
    logged = sync_log.read(ctx.env.dispatcher.log_file, namespaces)
    changes = []
    for run in runs:
        for key, written, shown in run["changes"]:
            parts = sync_log.segments(written, shown, logged.get(key, []))
            if parts is not None:
                changes.append((shown - written, parts))
    return sync_log.slowest(changes)


def _sync_once(ctx: BenchContext, placed: list[tuple[Key, str]], workers: list[str],
               reason: str, profile: bool) -> dict:
    manager = ctx.timelines.manager
    calls = [(ctx.kubeconfig(worker), _status_flip(*key, reason)) for key, worker in placed]
    wanted = {key for key, _ in placed}
    with _profiled(ctx.dispatcher_pid, ctx.output / "profile-sync",
                   ctx.settings.profile and profile, ("gil", "wall")), \
            CpuAccount(ctx.env.process_groups(workers)) as cpu:
        run = ctx.runner.run(calls, rate=ctx.settings.sync_rate)
        missing = ctx.timelines.wait(
            lambda: {k for k in wanted
                     if (*k, SYNC_CONDITION, reason) not in manager.reason_seen},
            _wait_timeout(len(wanted)))
    lags, watch_lags, changes = [], [], []
    for index, (key, worker) in enumerate(placed):
        shown = manager.reason_seen.get((*key, SYNC_CONDITION, reason))
        if shown is None:
            continue
        lags.append(max(0.0, shown - run.starts[index]))
        changes.append((key, run.starts[index], shown))
        remote_seen = ctx.timelines.clusters[worker].reason_seen.get(
            (*key, SYNC_CONDITION, reason))
        if remote_seen is not None:
            watch_lags.append(max(0.0, shown - remote_seen))
    return {"lags": lags, "watch_lags": watch_lags, "changes": changes,
            "missing": len(missing), "cpu": cpu.figures()}


# --- scaling ---------------------------------------------------------------------------------

def scaling(ctx: BenchContext) -> list[dict]:
    """Burst throughput with 1, 2, 4, ... workers: a fresh dispatcher and namespace each,
    removed again before the next step."""
    steps = []
    for count in ctx.settings.scaling_workers:
        workers = ctx.env.worker_names[:count]
        ctx.env.start_dispatcher(workers, ctx.settings.placement_policy)
        namespace = f"bench-scale-{count}"
        try:
            figures = burst(ctx, namespace, ctx.settings.scaling_jobs, workers)
        finally:
            ctx.env.stop_dispatcher()
        figures.pop("latency_samples_ms")
        steps.append(figures)
        ctx.env.remove_namespaces([namespace])
        ctx.timelines.forget(namespace)
    return steps
