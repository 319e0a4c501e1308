"""One benchmark run end to end: clusters, scenarios in a fixed order, cleanup on every
exit path."""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
import time
from pathlib import Path

from bench import constrained, host_speed, log_streams, scale, scenarios
from bench.compare import run_comparison, run_workers_axis
from bench.environment import BenchClusters, describe
from bench.load import LoadRunner
from bench.report import targets
from bench.settings import BenchSettings
from bench.timeline import Timelines

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _constrained(ctx: scenarios.BenchContext, workers: list[str]) -> dict:
    """The constrained-placement workload under the standalone dispatcher."""
    namespace = "bench-constrained"
    constrained.prepare(ctx.env, workers, namespace)
    try:
        return constrained.constrained(ctx, namespace, workers,
                                       ctx.settings.constrained_jobs,
                                       timeout=ctx.settings.constrained_timeout)
    finally:
        constrained.tear_down(ctx.env, workers)


def run_benchmark(settings: BenchSettings, output: Path, state_dir: Path | None = None,
                  mode: str = "full", results: dict | None = None) -> dict:
    """The suites ``settings.suite`` names, into ``results`` (filled as figures come, so
    a caller still has them when a scenario fails)."""
    output.mkdir(parents=True, exist_ok=True)
    results = results if results is not None else {}
    results.update({"mode": mode, "started": _now(), "settings": settings.as_dict(),
                    "scenario_seconds": {}})
    # Before the clusters this run starts are up and after they are down: the host's speed.
    reference = {"start": host_speed.reference_ms()}
    results.setdefault("environment", {})["reference_work_ms"] = reference
    if settings.suite == "scale":
        started = time.monotonic()
        scale.run_scale(settings, output, state_dir, results)
        results["scenario_seconds"]["scale"] = round(time.monotonic() - started, 1)
        reference["end"] = host_speed.reference_ms()
        results["finished"] = _now()
        results["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return results
    if settings.suite == "log-streams":
        log_streams.run_log_streams(settings, output, state_dir, results)
        reference["end"] = host_speed.reference_ms()
        results["finished"] = _now()
        results["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return results
    if settings.suite in ("all", "dispatcher"):
        (output / "logs").mkdir(exist_ok=True)
        # How fast the host is, second by second, while the dispatcher's scenarios run.
        with host_speed.Probe(output / "logs" / "host-probe.txt").running():
            _dispatcher_suite(settings, output, state_dir, results)
    if settings.suite in ("all", "compare"):
        started = time.monotonic()
        if settings.workers_axis:
            run_workers_axis(settings, output, results)
        else:
            run_comparison(settings, output, results)
        results["scenario_seconds"]["comparison"] = round(time.monotonic() - started, 1)
    reference["end"] = host_speed.reference_ms()
    results["targets"] = targets(results)
    results["finished"] = _now()
    results["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def _dispatcher_suite(settings: BenchSettings, output: Path, state_dir: Path | None,
                      results: dict) -> None:
    log_dir = output / "logs"
    log_dir.mkdir(exist_ok=True)
    reuse = state_dir is not None
    state = state_dir or Path(tempfile.mkdtemp(prefix="bench-clusters-"))
    env = BenchClusters(state, settings.harness_workers, log_dir, reuse=reuse,
                        dispatcher_args=settings.dispatcher_args)
    timelines: Timelines | None = None
    runner: LoadRunner | None = None

    def timed(name: str, fn, *args, **kwargs):
        started = time.monotonic()
        log.info("scenario %s ...", name)
        value = fn(*args, **kwargs)
        results["scenario_seconds"][name] = round(time.monotonic() - started, 1)
        return value

    try:
        started = time.monotonic()
        env.up()
        results["environment"].update({
            **describe(env, settings),
            "harness_up_seconds": round(time.monotonic() - started, 1)})
        timelines = Timelines({name: env.kubeconfig(name) for name in env.names}).start()
        runner = LoadRunner(settings.concurrency)
        ctx = scenarios.BenchContext(env, timelines, runner, settings, output)

        results["ceiling"] = timed("ceiling", scenarios.create_ceiling, ctx)
        workers = env.worker_names[:settings.burst_workers]
        # Before the other scenarios: the dispatcher counts a placed job whose pods do not
        # exist yet against every selection of a worker's Nodes, and their copies never get
        # pods (no operator runs for them), so afterwards the pool would look full.
        env.start_dispatcher(workers, settings.placement_policy)
        results["constrained"] = timed("constrained", _constrained, ctx, workers)
        env.stop_dispatcher()
        results["scaling"] = timed("scaling", scenarios.scaling, ctx)

        env.start_dispatcher(workers, settings.placement_policy)
        results["burst"] = timed(
            "burst", scenarios.burst, ctx, "bench-burst", settings.burst_jobs, workers,
            api_cost=True, profile=output / "profile-burst.svg" if settings.profile else None)
        mirrored = results["burst"]["dispatched"]
        footprint = {"burst": {"mirrored_jobs": mirrored, **results["burst"]["dispatcher"]},
                     "idle": timed("idle", scenarios.idle, ctx, mirrored)}

        burst_keys = [("bench-burst", f"job-{i:05d}")
                      for i in range(min(settings.sync_jobs, settings.burst_jobs))]
        results["sync"] = timed("sync", scenarios.status_sync, ctx, burst_keys, workers)

        results["steady"] = []
        for rate in settings.rates:
            figures = timed(f"steady-{rate}", scenarios.steady, ctx, rate, workers)
            results["steady"].append(figures)
            mirrored += figures["dispatched"]

        fill = settings.fill_to - mirrored
        if fill > 0:
            results["fill"] = timed(
                "fill", scenarios.burst, ctx, "bench-fill", fill, workers,
                profile=output / "profile-fill.svg" if settings.profile else None)
            results["fill"].pop("latency_samples_ms")
            mirrored += results["fill"]["dispatched"]
            footprint["fill_burst"] = {"mirrored_jobs": mirrored,
                                       **results["fill"]["dispatcher"]}
        footprint["fill_idle"] = timed("fill-idle", scenarios.idle, ctx, mirrored)
        results["footprint"] = footprint
    finally:
        if runner is not None:
            runner.close()
        if timelines is not None:
            # Watches that expired and were listed again: their objects got the list time.
            results["watch_relists"] = {name: t.relists
                                        for name, t in timelines.clusters.items()}
            timelines.stop()
        env.close()
