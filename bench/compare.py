"""The side-by-side comparison: Kueue MultiKueue (AllAtOnce, Incremental), Kueue with this
dispatcher as its external dispatcher, and this dispatcher standalone, on one set of
clusters that all run Kueue, with the same jobs and load.

Bursts and steady arrival run first for every contender, with a training operator on each
worker that runs the copies (a job counts as dispatched when a copy exists on a worker, and
as running when all its pods have run on kwok); then the constrained-placement workload
runs to the end under each contender. After each burst and
each steady step its jobs are deleted and waited for (what a contender has not removed
after ``drain_timeout`` is cleared by force and every Kueue restarted), so a contender's
backlog never queues ahead of its next step's jobs; everything a contender made is removed
before the next one starts. Figures land in ``results`` as they are measured, so a run that
stops half-way still has them.

``settings.compare_scenarios`` chooses among the burst (with the create ceiling), the
steady steps and the constrained run; ``settings.constrained_kinds`` makes the constrained
jobs a mix of TrainJobs and batch Jobs, for which every Kueue runs the ``batch/job``
integration too (a contender that cannot take a kind is refused before anything starts).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml
from kubernetes import client

from bench import constrained, scenarios
from bench.contenders import CONTENDERS, engage
from bench.environment import BenchClusters, describe, release_finalizers
from bench.load import PODS_PER_JOB, LoadRunner
from bench.settings import BenchSettings
from bench.stats import summary_ms
from bench.timeline import TRAINJOB_RESOURCE, WORKLOAD_RESOURCE, Timelines
from clusters import kueue
from trainjob import constants as c

log = logging.getLogger(__name__)

# How long clearing a step's leftovers by force may take before the run stops.
FORCE_TIMEOUT = 180.0
# What a step leaves behind: its TrainJobs (copies on the workers) and Kueue's Workloads.
DRAINED = (TRAINJOB_RESOURCE, WORKLOAD_RESOURCE)


# Kueue 0.19 builds its clients to the workers from the MultiKueueCluster's kubeconfig
# alone, so client-go's defaults apply to them and no setting changes them.
KUEUE_WORKER_CLIENTS = {"qps": 5, "burst": 10}


def client_limits(env: BenchClusters) -> dict:
    """The client rate limits every contender's controllers run with: Kueue's, and this
    dispatcher's set equal to them (its worker clients as Kueue's, its manager client as
    Kueue's manager client), so that no contender wins on a rate limit."""
    plane = env.control_plane("manager")
    connection = plane.kueue_configuration()["clientConnection"]
    manager = {"qps": connection["qps"], "burst": connection["burst"]}
    return {"kueue_manager_client": manager, "kueue_worker_clients": KUEUE_WORKER_CLIENTS,
            "dispatcher": {"manager_client": manager, "client": KUEUE_WORKER_CLIENTS}}


def dispatcher_config_file(limits: dict, directory: Path) -> Path:
    """A configuration file for this dispatcher with the comparison's client limits."""
    path = directory / "dispatcher-compare.yaml"
    path.write_text(yaml.safe_dump(limits["dispatcher"]))
    return path


def kueue_integrations(settings: BenchSettings) -> tuple[str, ...]:
    """The kinds every Kueue of the comparison manages: TrainJobs, and batch Jobs when the
    constrained run mixes them in."""
    if constrained.BATCH_JOB in settings.constrained_kinds and \
            "constrained" in settings.compare_scenarios:
        return ("batch/job", *kueue.INTEGRATIONS)
    return kueue.INTEGRATIONS


def refused_contenders(settings: BenchSettings) -> dict[str, str]:
    """The chosen contenders that cannot dispatch every kind of the constrained mix, with
    why (empty: all can)."""
    if "constrained" not in settings.compare_scenarios:
        return {}
    refused = {}
    for key in settings.contenders:
        cannot = [k for k in settings.constrained_kinds if k not in CONTENDERS[key].kinds]
        if cannot:
            refused[key] = (f"{key} ({CONTENDERS[key].title}) dispatches "
                            f"{', '.join(CONTENDERS[key].kinds)} only, not {', '.join(cannot)}")
    return refused


def run_comparison(settings: BenchSettings, output: Path, results: dict,
                   name: str = "comparison") -> None:
    """Every contender in ``settings.contenders`` through burst, steady and constrained
    (those of them ``settings.compare_scenarios`` names); figures into
    ``results["comparison"]`` as they come. ``name`` keeps apart the logs and profiles of
    several comparisons in one output directory."""
    refused = refused_contenders(settings)
    if refused:
        raise ValueError("the constrained mix cannot run: " + "; ".join(refused.values()))
    log_dir = output / "logs" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    env = BenchClusters(Path(tempfile.mkdtemp(prefix="bench-kueue-clusters-")),
                        settings.burst_workers, log_dir, kueue=True,
                        dispatcher_args=settings.dispatcher_args,
                        kueue_integrations=kueue_integrations(settings))
    figures: dict = results.setdefault("comparison", {})
    figures.update({"contenders": {}, "seconds": {}})
    if kueue_integrations(settings) != kueue.INTEGRATIONS:
        figures["kueue_integrations"] = list(kueue_integrations(settings))
    steps = settings.compare_scenarios
    timelines: Timelines | None = None
    runner: LoadRunner | None = None
    try:
        started = time.monotonic()
        env.up()
        figures["harness_up_seconds"] = round(time.monotonic() - started, 1)
        figures["client_limits"] = limits = client_limits(env)
        config_args = ("--config", str(dispatcher_config_file(limits, log_dir)))
        environment = results.setdefault("environment", {})
        for key, value in describe(env, settings).items():
            environment.setdefault(key, value)
        timelines = Timelines({name: env.kubeconfig(name) for name in env.names},
                              workloads=True, pods_per_job=PODS_PER_JOB).start()
        runner = LoadRunner(settings.concurrency)
        ctx = scenarios.BenchContext(env, timelines, runner, settings, output)
        if "burst" in steps:
            # The ceiling on these clusters: every create passes Kueue's webhooks here.
            figures["ceiling"] = scenarios.create_ceiling(ctx, settings.compare_jobs)
        workers = env.worker_names
        chosen = [CONTENDERS[key] for key in settings.contenders]
        if "burst" in steps or "steady" in steps:
            # The copies run: a burst's latency goes on to all of a job's pods Running on
            # kwok.
            env.start_operators(workers, log_name="operator-burst")
        for contender in chosen if "burst" in steps or "steady" in steps else []:
            mine = figures["contenders"].setdefault(
                contender.key, {"title": contender.title, "steady": []})
            engage(env, contender, workers, settings.placement_policy, config_args)
            namespaces = []
            started = time.monotonic()
            if "burst" in steps:
                namespace = f"cmp-{contender.key.lower()}-burst"
                namespaces.append(namespace)
                # py-spy reads Python stacks only: the contenders that run this dispatcher.
                suffix = name.removeprefix("comparison")
                profile = (output / f"profile-compare{suffix}-{contender.key}.svg"
                           if settings.profile and contender.mode is not None else None)
                mine["burst"] = scenarios.burst(ctx, namespace, settings.compare_jobs,
                                                workers, api_cost=True,
                                                submit=contender.submit, profile=profile,
                                                wait=scenarios.short_wait)
                _from_quota_reserved(ctx, mine["burst"], namespace)
                mine["burst"]["drain"] = _drain(ctx, namespace)
            for rate in settings.compare_rates if "steady" in steps else ():
                namespace = f"cmp-{contender.key.lower()}-rate-{rate}"
                namespaces.append(namespace)
                step = scenarios.steady(ctx, rate, workers,
                                        seconds=settings.compare_rate_seconds,
                                        namespace=namespace, submit=contender.submit,
                                        wait=scenarios.short_wait, repeats=1,
                                        settle=False)
                _from_quota_reserved(ctx, step, namespace)
                step["drain"] = _drain(ctx, namespace)
                mine["steady"].append(step)
            env.stop_dispatcher()
            _clear(ctx, namespaces)
            figures["seconds"][f"{contender.key} burst+steady"] = round(
                time.monotonic() - started, 1)

        env.stop_operators()
        if "constrained" not in steps:
            return
        constrained.prepare(env, workers)
        try:
            for contender in chosen:
                started = time.monotonic()
                engage(env, contender, workers, settings.placement_policy, config_args)
                namespace = f"cmp-{contender.key.lower()}-constrained"
                mine = figures["contenders"].setdefault(contender.key,
                                                        {"title": contender.title})
                mine["constrained"] = constrained.constrained(
                    ctx, namespace, workers, settings.constrained_jobs,
                    submit=contender.submit, timeout=settings.constrained_timeout,
                    kinds=settings.constrained_kinds)
                env.stop_dispatcher()
                _clear(ctx, [namespace])
                figures["seconds"][f"{contender.key} constrained"] = round(
                    time.monotonic() - started, 1)
        finally:
            constrained.tear_down(env, workers)
    finally:
        if runner is not None:
            runner.close()
        if timelines is not None:
            timelines.stop()
        env.close()


def _from_quota_reserved(ctx: scenarios.BenchContext, figures: dict, namespace: str) -> None:
    """For jobs Kueue queued, from Kueue's quota reservation on the manager (the moment a
    dispatcher may act on the Workload): latency to the first remote copy, and (C) to the
    external dispatcher's nomination, which is C's dispatch decision (Kueue copies after)."""
    copies, nominations = [], []
    for name in scenarios.job_names("job", figures["jobs"]):
        reserved = ctx.timelines.workloads.condition_seen.get(
            (namespace, name, "QuotaReserved"))
        if reserved is None:
            continue
        remote = ctx.timelines.remote((namespace, name))
        nominated = ctx.timelines.workloads.nominated.get((namespace, name))
        if remote is not None:
            copies.append(max(0.0, remote[1] - reserved))
        if nominated is not None:
            nominations.append(max(0.0, nominated - reserved))
    if copies:
        figures["latency_from_quota_reserved"] = summary_ms(copies)
    if nominations:
        figures["nomination_from_quota_reserved"] = summary_ms(nominations)


def _drain(ctx: scenarios.BenchContext, namespace: str) -> dict:
    """Delete the step's TrainJobs on the manager, as a user would, with every controller
    still running, and wait until neither they, their Workloads nor their copies on the
    workers are left (a dispatcher still deleting copies would slow the next step). What
    is still there after the settings' drain timeout (Kueue's own dispatchers delete
    remote copies through 5-qps clients: a thousand-job backlog takes many minutes) is
    recorded and cleared by force; with a timeout of 0, the step is always cleared so."""
    timeout = ctx.settings.drain_timeout
    apis = {name: client.CustomObjectsApi(ctx.env.apis[name]) for name in ctx.env.names}
    apis["manager"].delete_collection_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS)
    started = time.monotonic()
    left = _wait_gone(apis, namespace, timeout)
    # A timeout of 0 allows no wait: the step is cleared by force and every Kueue restarted
    # even when the deletion happened to be over at the one look (a few jobs' can be).
    forced = timeout <= 0
    figures = {"seconds": round(time.monotonic() - started, 1),
               "complete": not left and not forced}
    if left or forced:
        if left:
            log.warning("%s: after %.0f s, still there: %s; clearing it by force", namespace,
                        timeout, left)
        figures["left"] = left
        figures["forced_seconds"] = _force_clear(ctx, apis, namespace)
    return figures


def _wait_gone(apis: dict[str, client.CustomObjectsApi], namespace: str, timeout: float,
               each=None) -> dict[str, int]:
    """Poll until no TrainJob or Workload of ``namespace`` is left on any cluster, calling
    ``each`` first every round; returns what is left at ``timeout`` (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while True:
        if each is not None:
            each()
        left = {f"{name} {plural}": count for name, api in apis.items()
                for group, version, plural in DRAINED
                if (count := _count(api, group, version, namespace, plural))}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(1)  # polling the apiserver's count, not synchronising with a thread


def _force_clear(ctx: scenarios.BenchContext, apis: dict[str, client.CustomObjectsApi],
                 namespace: str) -> float:
    """Take out what a user's deletion left: delete it on every cluster and remove its
    finalizers (Kueue's webhooks still answer), then restart every Kueue, so the next step
    starts with neither the objects nor the calls a controller still had queued for them
    (Kueue reads each remote object through its 5-qps clients before it deletes it, gone
    or not). Returns the seconds it took."""
    started = time.monotonic()

    def sweep() -> None:
        for name, api in apis.items():
            for resource in DRAINED:
                group, version, plural = resource
                api.delete_collection_namespaced_custom_object(group, version, namespace,
                                                               plural)
                release_finalizers(ctx.env.apis[name], resource, namespace)

    left = _wait_gone(apis, namespace, FORCE_TIMEOUT, sweep)
    if left:
        raise RuntimeError(f"namespace {namespace}: still there {FORCE_TIMEOUT:.0f} s after "
                           f"being deleted without finalizers: {left}")
    ctx.env.restart_kueues()
    return round(time.monotonic() - started, 1)


def _count(api: client.CustomObjectsApi, group: str, version: str, namespace: str,
           plural: str) -> int:
    """How many objects there are, from a one-item page (the apiserver counts the rest):
    Kueue is still deleting while this polls, and full lists would slow it down."""
    page = api.list_namespaced_custom_object(group, version, namespace, plural, limit=1)
    return len(page["items"]) + (page["metadata"].get("remainingItemCount") or 0)


def _clear(ctx: scenarios.BenchContext, namespaces: list[str]) -> None:
    """What a contender made, gone before the next one starts (Kueue keeps running: it
    releases its Workloads itself)."""
    ctx.env.remove_namespaces(namespaces)
    for namespace in namespaces:
        ctx.timelines.forget(namespace)


def run_workers_axis(settings: BenchSettings, output: Path, results: dict) -> None:
    """The comparison once per count of ``settings.workers_axis``, each on clusters of its
    own with the same jobs; each count's figures into ``results["workers_axis"][count]``
    (shaped as a single comparison's ``results``) as they come."""
    axis: dict = results.setdefault("workers_axis", {})
    for workers in settings.workers_axis:
        started = time.monotonic()
        mine = axis.setdefault(str(workers), {})
        run_comparison(replace(settings, burst_workers=workers), output, mine,
                       name=f"comparison-{workers}-workers")
        mine["seconds"] = round(time.monotonic() - started, 1)
        for key, value in mine.pop("environment", {}).items():
            results.setdefault("environment", {}).setdefault(key, value)
