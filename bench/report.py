"""The figures as the targets they are judged against and as a Markdown table."""

from __future__ import annotations

from itertools import pairwise

from bench import host_speed
from bench.apicost import DRY_RUN
from bench.repeats import host_speeds
from controller_kit.gc_pauses import PAUSE_BUCKETS


def _close(value, wanted: float, tolerance: float = 0.005) -> bool:
    return value is not None and abs(value - wanted) <= tolerance


def targets(results: dict) -> list[dict]:
    """Each target with what was measured and whether it was met (None: not measured at
    the scale the target is about)."""
    rows = _dispatcher_targets(results) if "footprint" in results else []
    if results.get("comparison", {}).get("contenders"):
        rows += _comparison_targets(results)
    for count, figures in _axis(results):
        for row in _comparison_targets(_at(results, count, figures)):
            rows.append({**row, "target": f"{count} workers: {row['target']}"})
    return rows


def _axis(results: dict) -> list[tuple[int, dict]]:
    """The workers axis's comparisons that have figures, by worker count."""
    return sorted((int(count), figures["comparison"])
                  for count, figures in (results.get("workers_axis") or {}).items()
                  if (figures.get("comparison") or {}).get("contenders"))


def _at(results: dict, count: int, comparison: dict) -> dict:
    """The run's results as if ``comparison`` at ``count`` workers were its only one."""
    return {"mode": results.get("mode"), "comparison": comparison,
            "settings": {**results["settings"], "burst_workers": count}}


def _figure(results: dict, key: str, *path: str):
    """A contender's figure at ``path``, None when it was not measured."""
    value = results["comparison"]["contenders"].get(key)
    for step in path:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def _steady_p99(results: dict, key: str, rate: int):
    step = next((s for s in _figure(results, key, "steady") or [] if s["rate"] == rate), None)
    return step["latency"]["p99_ms"] if step else None


def _comparison_targets(results: dict) -> list[dict]:
    rows = []
    a = _figure(results, "A", "burst", "throughput_jobs_per_second")
    d = _figure(results, "D", "burst", "throughput_jobs_per_second")
    rows.append({"target": "D's burst throughput >= 2x A's (same clusters, jobs, load)",
                 "measured": f"D {d} jobs/s, A {a} jobs/s"
                             + (f" ({d / a:.1f}x)" if a and d is not None else ""),
                 "met": (d >= 2 * a) if a and d is not None else None})
    rows += _constrained_targets(results)
    # Throughput against the write bound and p99 at 50 jobs/s are D's at its own client
    # limits: this dispatcher's scenarios of the same run (the comparison holds D to
    # Kueue's 5 qps per worker). Without them, the comparison's D against the comparison's
    # apiservers.
    if "burst" in results and results.get("ceiling"):
        rows.append(_write_bound_row(
            "D's burst throughput", results["burst"], results["ceiling"],
            "this dispatcher's scenarios, its default client limits"))
    else:
        rows.append(_write_bound_row(
            "D's burst throughput", _figure(results, "D", "burst"),
            results["comparison"].get("ceiling"), "the comparison, Kueue's client limits"))
    own_step = next((s for s in results.get("steady") or [] if s["rate"] == 50), None)
    p99_d = own_step["latency"]["p99_ms"] if own_step else _steady_p99(results, "D", 50)
    d_where = "its own scenario" if own_step else "the comparison"
    step_c = next((s for s in _figure(results, "C", "steady") or [] if s["rate"] == 50), {})
    p99_c = (step_c.get("nomination_from_quota_reserved") or {}).get("p99_ms")
    copy_c = (step_c.get("latency_from_quota_reserved") or {}).get("p99_ms")
    rows.append({"target": "dispatch p99 <= 100 ms at 50 jobs/s for D and for C (C from "
                           "Kueue's quota reservation)",
                 "measured": f"D {p99_d} ms ({d_where}); C {p99_c} ms from quota reservation "
                             f"to nomination (to the copy, made by Kueue: {copy_c} ms)"
                             if p99_d is not None or p99_c is not None
                             else "50 jobs/s not run",
                 "met": (p99_d <= 100 and p99_c <= 100)
                 if p99_d is not None and p99_c is not None else None})
    return rows


def _constrained_targets(results: dict) -> list[dict]:
    """The constrained target, when the comparison ran constrained placement."""
    if "constrained" not in results["settings"].get("compare_scenarios", ("constrained",)):
        return []
    span_a = _figure(results, "A", "constrained", "makespan_seconds")
    span_c = _figure(results, "C", "constrained", "makespan_seconds")
    stuck_c = _figure(results, "C", "constrained", "pods_unschedulable")
    ran_a = _figure(results, "A", "constrained") is not None
    # A run that did not finish within the timeout has no makespan: longer than the
    # timeout, which is then the bound C is judged against.
    timeout = results["settings"]["constrained_timeout"]
    unfinished = f"not finished in {timeout:g} s"
    a_was = f"{span_a} s" if span_a else unfinished if ran_a else "not run"
    return [{"target": "C's constrained makespan <= 0.8x A's, with 0 pods unschedulable",
             "measured": f"C {f'{span_c} s' if span_c else unfinished} ({stuck_c} pods "
                         f"unschedulable), A {a_was}",
             "met": (span_c is not None and stuck_c == 0
                     and span_c <= 0.8 * (span_a if span_a is not None else timeout))
             if ran_a and stuck_c is not None else None}]

# The share of the apiservers' write bound a burst is to reach.
WRITE_BOUND_SHARE = 0.5


def write_bound(burst: dict | None, ceiling: dict | None) -> dict | None:
    """How many jobs/s the apiservers could take at a burst's writes per job: for each
    apiserver, its create ceiling (a plain client's TrainJob creates/s on the manager, on a
    worker) divided by the writes per job it served (the manager's with the user's create);
    the bound is the lowest, on the apiserver named. None when not measured."""
    if not ceiling or not (burst or {}).get("api", {}).get("per_job") or not burst.get("jobs"):
        return None
    by_server = writes_by_apiserver(burst)
    bounds = {}
    for name, writes in by_server.items():
        writes += 1 if name == "manager" else 0
        limit = ceiling["manager" if name == "manager" else "worker-1"]["creates_per_second"]
        if writes > 0:
            bounds[name] = (limit / writes, limit, writes)
    if not bounds:
        return None
    name = min(bounds, key=lambda n: bounds[n][0])
    bound, limit, writes = bounds[name]
    return {"jobs_per_second": round(bound, 1), "apiserver": name,
            "creates_per_second": limit, "writes_per_job": round(writes, 3)}


WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
WORKER_COPIES = {"TrainJob": "trainjobs.trainer.kubeflow.org",
                 "Workload": "workloads.kueue.x-k8s.io"}


def _requests(burst: dict) -> dict[str, list[dict]]:
    return burst.get("api", {}).get("requests") or {}


def writes_by_apiserver(burst: dict) -> dict[str, float]:
    """A burst's writes per submitted job on each apiserver, every resource (the manager's
    without the user's create)."""
    api = burst["api"]
    if "writes_per_job_by_apiserver" in api:
        return api["writes_per_job_by_apiserver"]
    if _requests(burst):
        # Results from before the figure was kept: from the apiservers' request tables.
        return {name: round((sum(r["count"] for r in rows if r["verb"] in WRITE_VERBS)
                             - (burst["jobs"] if name == "manager" else 0)) / burst["jobs"], 3)
                for name, rows in _requests(burst).items()}
    workers = burst.get("workers") or 1
    return {"manager": api["per_job"]["manager_writes_all"],
            "workers (mean)": api["per_job"]["worker_writes_all"] / workers}


def copies(burst: dict) -> dict[str, float]:
    """Per submitted job, the create (POST) and DELETE requests a burst's workers' apiservers
    served for TrainJob copies and for Workloads (Kueue's copies of the manager's Workload,
    or the ones a worker's Kueue made for a copy). Requests, answered or refused: a create
    Kueue repeats after AlreadyExists counts each time. Dry-run creates are not among them
    (``dry_runs``)."""
    figures = {}
    for kind, resource in WORKER_COPIES.items():
        for verb, what in (("POST", "created"), ("DELETE", "deleted")):
            served = sum(r["count"] for name, rows in _requests(burst).items()
                         if name != "manager" for r in rows
                         if r["resource"] == resource and r["verb"] == verb
                         and not r["subresource"])
            figures[f"{kind} {what}"] = round(served / burst["jobs"], 3)
    return figures


def dry_runs(burst: dict) -> dict[str, float]:
    """Per submitted job, the dry-run requests (any resource) the manager's apiserver and the
    workers' together served over a burst: Kueue's job reconciler dry-run-creates the
    Workload it would build on every reconcile of a job it manages. Admitted, webhooks
    included, but not stored, so not among the writes."""
    counts = {"manager": 0, "workers": 0}
    for name, rows in _requests(burst).items():
        counts["manager" if name == "manager" else "workers"] += sum(
            r["count"] for r in rows if r["verb"].endswith(DRY_RUN))
    return {name: round(n / burst["jobs"], 3) for name, n in counts.items()}


def _write_bound_row(label: str, burst: dict | None, ceiling: dict | None,
                     where: str = "") -> dict:
    """The write-bound target for one burst: its throughput against ``write_bound``."""
    bound = write_bound(burst, ceiling)
    target = (f"{label} >= {WRITE_BOUND_SHARE:.0%} of the apiservers' write bound (create "
              "ceiling / writes per job, busiest apiserver)")
    if bound is None:
        return {"target": target, "measured": "no burst with API cost and ceiling measured",
                "met": None}
    got = burst["throughput_jobs_per_second"]
    exact = bound["creates_per_second"] / bound["writes_per_job"]
    return {"target": target,
            "measured": f"{got} jobs/s = {got / exact:.1%} of "
                        f"{bound['jobs_per_second']} jobs/s ({bound['apiserver']}: "
                        f"{bound['creates_per_second']} creates/s / "
                        f"{bound['writes_per_job']} writes per job)"
                        + (f"; {where}" if where else ""),
            "met": got >= WRITE_BOUND_SHARE * exact}


def _dispatcher_targets(results: dict) -> list[dict]:
    rows = []
    burst = results["burst"]
    rows.append(_write_bound_row("burst throughput", burst, results["ceiling"]))

    at_50 = next((s for s in results["steady"] if s["rate"] == 50), None)
    p99 = at_50["latency"]["p99_ms"] if at_50 else None
    rows.append({"target": "dispatch latency p99 <= 100 ms at 50 jobs/s",
                 "measured": f"{p99} ms" if at_50 else "50 jobs/s not run",
                 "met": (p99 is not None and p99 <= 100) if at_50 else None})

    lag = results["sync"]["lag"]["p99_ms"]
    rows.append({"target": "status-sync lag p99 <= 100 ms", "measured": f"{lag} ms",
                 "met": lag is not None and lag <= 100})

    cost = burst["api"]["per_job"]
    rows.append({"target": "dispatch costs 2 writes (manager 1 PATCH, worker 1 create)",
                 "measured": f"manager {cost['manager_trainjob_writes']} "
                             f"(PATCH {cost['manager_trainjob_patches']}), worker "
                             f"{cost['worker_trainjob_writes']} (create "
                             f"{cost['worker_trainjob_creates']}); plus "
                             f"{cost['manager_event_writes']} Event writes",
                 "met": _close(cost["manager_trainjob_writes"], 1)
                 and _close(cost["manager_trainjob_patches"], 1)
                 and _close(cost["worker_trainjob_writes"], 1)})

    per_change = results["sync"]["manager_writes_per_status_change"]
    rows.append({"target": "each remote status change costs exactly 1 manager write",
                 "measured": f"{per_change} manager writes per change",
                 "met": _close(per_change, 1)})

    footprint = results["footprint"]
    largest = footprint.get("fill_burst") or footprint["idle"]
    mirrored = footprint["fill_idle"]["mirrored_jobs"]
    # The steady steps may take the count past the fill's (then no fill runs).
    peak = max(largest["peak_rss_mb"], footprint["fill_idle"]["peak_rss_mb"],
               *(s["dispatcher"]["peak_rss_mb"] for s in results.get("steady") or []))
    rows.append({"target": "dispatcher RSS <= 250 MB with 10,000 mirrored jobs",
                 "measured": f"{peak} MB peak with {mirrored} mirrored",
                 "met": (peak <= 250) if mirrored >= 10000 else None})

    steps = results["scaling"]
    series = [s["throughput_jobs_per_second"] for s in steps]
    manager_ceiling = results["ceiling"]["manager"]["creates_per_second"]
    grows = bool(series) and all(b >= 0.9 * a for a, b in pairwise(series)) and (
        series[-1] >= 1.2 * series[0] or series[0] >= 0.8 * manager_ceiling)
    rows.append({"target": "throughput grows with workers until the manager apiserver is "
                           "the limit",
                 "measured": ", ".join(f"{s['workers']}w {s['throughput_jobs_per_second']}"
                                       for s in steps) + " jobs/s",
                 "met": grows if len(series) > 1 else None,
                 "rule": "no step below 90% of the previous one, and the largest step at "
                         ">= 120% of one worker (or one worker already >= 80% of the "
                         "manager's create ceiling)"})
    return rows


def _lat(summary: dict) -> str:
    return " / ".join(str(summary[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))


def _repeated(step: dict) -> tuple[str, str]:
    """What a repeated step's row says of its repeats: after its scenario, after its
    figure's name (nothing for a step run once)."""
    repeats = step.get("repeats") or 1
    return (f" x{repeats}", f" (all {repeats} repeats' samples)") if repeats > 1 else ("", "")


def _spread_rows(summary: dict, runs: list[dict]) -> list[str]:
    """The p99 and p50 of each repeat, as min / median / max, for a repeated step, and the
    host's speed before each repeat (``repeats.settle``)."""
    spread = summary.get("spread")
    if not spread:
        return []
    cells = "; ".join(f"{name[:-3]} {v['min']} / {v['median']} / {v['max']}"
                      for name in ("p50_ms", "p99_ms") if (v := spread.get(name)))
    rows = [f"| | over the repeats, min / median / max ms | {cells} |"]
    speeds = host_speeds(runs)
    if speeds:
        rows.append("| | host speed before each repeat: reference work CPU ms | "
                    + " / ".join(str(x) for x in speeds) + " |")
    slow = [r["cpu"]["host_slow_share"] for r in runs
            if (r.get("cpu") or {}).get("host_slow_share") is not None]
    if slow:
        rows.append(f"| | host slow during each repeat (reference work over "
                    f"{host_speed.SLOW:g}x its fastest) | "
                    + " / ".join(f"{x:.0%}" for x in slow) + " |")
    return rows


def _cpu_groups(burst: dict) -> str:
    """The two last cells of a table row: CPU seconds by process group."""
    cpu = burst["cpu"]
    names = " / ".join(cpu["cpu_seconds"])
    values = " / ".join(str(v) for v in cpu["cpu_seconds"].values())
    stolen = cpu.get("host_steal_share")
    stolen = f", {stolen:.1%} stolen by the host" if stolen is not None else ""
    slow = cpu.get("host_slow_share")
    slow = f", host slow {slow:.0%} of the time" if slow is not None else ""
    return (f"{names} | {values} (of {cpu['host_cpu_seconds_available']} s available; "
            f"machine busy {cpu['host_busy_share']:.0%}{stolen}{slow})")


def _met(value) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[value]


def render_table(results: dict) -> str:
    parts = []
    if results.get("incomplete"):
        parts.append(f"INCOMPLETE RUN: {results['incomplete']}\n")
    parts.extend(_host_speed_line(results.get("environment", {})))
    if "footprint" in results:
        parts.append(_dispatcher_table(results))
    if results.get("comparison", {}).get("contenders"):
        parts.append(_comparison_table(results))
    axis = _axis(results)
    for count, comparison in axis:
        parts.append(_comparison_table(_at(results, count, comparison)))
    if axis:
        parts.append(_axis_table(results, axis))
        parts.append(_ratio_table(axis))
    if results.get("targets"):
        lines = ["| Target | Measured | Met |", "|---|---|---|"]
        for row in results["targets"]:
            lines.append(f"| {row['target']} | {row['measured']} | {_met(row['met'])} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _ceiling_note(ceiling: dict | None) -> str:
    if not ceiling:
        return ""
    return (f"; create ceiling on these clusters (a plain client, {ceiling['manager']['jobs']} "
            f"jobs, {ceiling['concurrency']} threads): manager "
            f"{ceiling['manager']['creates_per_second']} / worker "
            f"{ceiling['worker-1']['creates_per_second']} creates/s")


def _drained(drain: dict) -> str:
    """How a step's deletion went: its seconds, or what was still there then and how long
    clearing it by force took."""
    if drain["complete"]:
        return f"{drain['seconds']}"
    left = sum((drain.get("left") or {}).values())
    forced = drain.get("forced_seconds")
    return (f"not within {drain['seconds']} ({left} objects left"
            + (f"; cleared by force in {forced} s" if forced is not None else "") + ")")


def _comparison_table(results: dict) -> str:
    comparison = results["comparison"]
    contenders = comparison["contenders"]
    keys = list(contenders)
    limits = comparison.get("client_limits", {})
    manager = limits.get("kueue_manager_client", {})
    workers = limits.get("kueue_worker_clients", {})
    lines = [f"Side by side with Kueue MultiKueue ({results['mode']}): the same "
             f"{results['settings']['burst_workers']} workers, all running Kueue; every "
             f"contender's manager client qps {manager.get('qps')} (burst "
             f"{manager.get('burst')}), its worker clients qps {workers.get('qps')} (burst "
             f"{workers.get('burst')}: Kueue's fixed value, this dispatcher set to it)"
             + _ceiling_note(comparison.get("ceiling")), "",
             "| Figure | " + " | ".join(f"{k}: {contenders[k]['title']}" for k in keys) + " |",
             "|---|" + "---|" * len(keys)]

    def row(label: str, cell) -> None:
        values = []
        for key in keys:
            try:
                values.append(str(cell(contenders[key])))
            except (KeyError, TypeError, IndexError):
                values.append("n/a")
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    jobs = results["settings"]["compare_jobs"]
    # Rows of a step no contender ran (--compare-scenarios) are left out.
    if any("burst" in m for m in contenders.values()):
        row(f"burst {jobs}: throughput jobs/s (dispatched/jobs)",
            lambda m: f"{m['burst']['throughput_jobs_per_second']} "
                      f"({m['burst']['dispatched']}/{m['burst']['jobs']})")
        row("burst latency p50 / p90 / p99 / max ms", lambda m: _lat(m["burst"]["latency"]))
        row("burst: create to all of a job's pods Running on kwok p50 / p99 ms (jobs)",
            lambda m: f"{m['burst']['running_latency']['p50_ms']} / "
                      f"{m['burst']['running_latency']['p99_ms']} "
                      f"({m['burst']['running_latency']['count']})")
        row("API writes per job: manager / workers, all resources (workers' JobSets, Jobs and "
            "pods of running the copies)",
            lambda m: f"{m['burst']['api']['per_job']['manager_writes_all']} / "
                      f"{m['burst']['api']['per_job']['worker_writes_all']}"
                      + (f" ({m['burst']['api']['per_job']['worker_writes_running']})"
                         if "worker_writes_running" in m["burst"]["api"]["per_job"] else ""))
        row("API writes per job by apiserver: manager (without the user's create) / each "
            "worker", lambda m: " / ".join(
                str(v) for v in writes_by_apiserver(m["burst"]).values()))
        row("on the workers, per job: TrainJob create / delete requests; Workload create / "
            "delete requests", lambda m: _copies_cell(m["burst"]))
        row("dry-run requests per job (Kueue's Workload dry-run creates, not stored): manager "
            "/ workers", lambda m: " / ".join(str(v) for v in dry_runs(m["burst"]).values()))
        row("burst CPU ms per job: " + " / ".join(CPU_PER_JOB), lambda m: " / ".join(
            str(_cpu_ms_per_job(m["burst"], group)) for group in CPU_PER_JOB))
        row("API reads per job (GET+LIST): manager / workers",
            lambda m: f"{m['burst']['api']['per_job']['manager_reads']} / "
                      f"{m['burst']['api']['per_job']['worker_reads']}")
        row("admission webhook ms waited per job: manager / workers",
            lambda m: f"{m['burst']['api']['webhooks']['manager']['ms_per_job']} / "
                      f"{m['burst']['api']['webhooks']['workers']['ms_per_job']}")
        for group in ("kueue manager", "kueue workers", "dispatcher", "training operators",
                      "worker scheduler+jobset+kwok", "manager apiserver+etcd",
                      "workers apiserver+etcd"):
            row(f"burst CPU s: {group}", lambda m, g=group: m["burst"]["cpu"]["cpu_seconds"][g])
        row("burst: machine busy", lambda m: f"{m['burst']['cpu']['host_busy_share']:.0%}")
        row("burst: seconds until its jobs were gone after deletion",
            lambda m: _drained(m["burst"]["drain"]))
    rates = sorted({s["rate"] for m in contenders.values() for s in m.get("steady", [])})
    for rate in rates:
        row(f"steady {rate} jobs/s: latency p50 / p99 ms (dispatched/jobs)",
            lambda m, r=rate: next(f"{s['latency']['p50_ms']} / {s['latency']['p99_ms']} "
                                   f"({s['dispatched']}/{s['jobs']})"
                                   for s in m["steady"] if s["rate"] == r))
    if any("steady" in m for m in contenders.values()):
        row("steady: seconds until each step's jobs were gone after deletion",
            lambda m: "; ".join(f"{s['rate']}/s {_drained(s['drain'])}"
                                for s in m["steady"]))
    for rate in rates:
        row(f"steady {rate} jobs/s: p50 / p99 ms from Kueue's quota reservation",
            lambda m, r=rate: next(f"{s['latency_from_quota_reserved']['p50_ms']} / "
                                   f"{s['latency_from_quota_reserved']['p99_ms']}"
                                   for s in m["steady"] if s["rate"] == r))
    for rate in rates:
        row(f"steady {rate} jobs/s: p50 / p99 ms from quota reservation to nomination",
            lambda m, r=rate: next(f"{s['nomination_from_quota_reserved']['p50_ms']} / "
                                   f"{s['nomination_from_quota_reserved']['p99_ms']}"
                                   for s in m["steady"] if s["rate"] == r))
    tight = "constrained {} jobs".format(results["settings"]["constrained_jobs"])
    mixed = next((m["constrained"]["kind_mix"] for m in contenders.values()
                  if (m.get("constrained") or {}).get("kind_mix")), None)
    each = tight
    if mixed:
        tight += f" ({', '.join(mixed)} in turn)"
    row(f"{tight}: makespan s (finished/jobs)",
        lambda m: f"{m['constrained']['makespan_seconds']} "
                  f"({m['constrained']['finished']}/{m['constrained']['jobs']})")
    row(f"{tight}: pods unschedulable (longest wait s) / copies withdrawn",
        lambda m: f"{m['constrained']['pods_unschedulable']}"
                  f"{_longest(m['constrained'])} / {m['constrained']['copies_withdrawn']}")
    row(f"{tight}: create to all trainer pods Running p50 / p99 ms",
        lambda m: f"{m['constrained']['running_latency']['p50_ms']} / "
                  f"{m['constrained']['running_latency']['p99_ms']}")
    row(f"{tight}: mean Node utilisation",
        lambda m: ", ".join(f"{r} {v:.0%}" if v is not None else f"{r} n/a"
                            for r, v in m["constrained"]["utilisation"].items()))
    # A mix of kinds: the same figures for each kind's jobs.
    kinds = list(dict.fromkeys(kind for m in contenders.values()
                               for kind in (m.get("constrained") or {}).get("kinds") or {}))
    for kind in kinds:
        mix = f"{each}: the {kind}s"
        row(f"{mix}: makespan s (finished/jobs)",
            lambda m, k=kind: f"{m['constrained']['kinds'][k]['makespan_seconds']} "
                              f"({m['constrained']['kinds'][k]['finished']}/"
                              f"{m['constrained']['kinds'][k]['jobs']})")
        row(f"{mix}: pods unschedulable (longest wait s) / copies withdrawn",
            lambda m, k=kind: f"{m['constrained']['kinds'][k]['pods_unschedulable']}"
                              f"{_longest(m['constrained']['kinds'][k])} / "
                              f"{m['constrained']['kinds'][k]['copies_withdrawn']}")
        row(f"{mix}: create to all trainer pods Running p50 / p99 ms",
            lambda m, k=kind: f"{m['constrained']['kinds'][k]['running_latency']['p50_ms']} / "
                              f"{m['constrained']['kinds'][k]['running_latency']['p99_ms']}")
        row(f"{mix}: mean Node utilisation (the pool's, by this kind's pods)",
            lambda m, k=kind: ", ".join(
                f"{r} {v:.0%}" if v is not None else f"{r} n/a"
                for r, v in m["constrained"]["kinds"][k]["utilisation"].items()))
    return "\n".join(lines)


def _host_speed_line(env: dict) -> list[str]:
    reference = env.get("reference_work_ms")
    if not reference:
        return []
    end = f", {reference['end']} ms at the end" if reference.get("end") else ""
    return [f"Host speed: the reference work took {reference['start']} ms of CPU at the "
            f"start{end} (lower is faster; compare runs by it)"]


def _revision(env: dict) -> str:
    source = env.get("source")  # absent in runs from before it was recorded
    if not source:
        return ""
    return f"; commit {source['commit'][:12]}" + (
        " with local changes" if source["local_changes"] else "")


def _dispatcher_table(results: dict) -> str:
    env = results["environment"]
    dispatcher = env["dispatcher"]
    lines = [
        f"Dispatcher benchmark ({results['mode']}): Kubernetes "
        f"{env['kubernetes'].get('gitVersion')}, {env['cpu_count']} CPUs, "
        f"{dispatcher['config']['placement_policy']} placement, "
        f"{dispatcher['reconcile_workers']} reconcile workers, client qps "
        f"{dispatcher['config']['client']['qps']:g} per worker{_revision(env)}",
        "",
        "| Scenario | Figure | Measured |",
        "|---|---|---|",
    ]
    ceiling = results["ceiling"]
    lines.append(f"| create ceiling ({ceiling['manager']['jobs']} jobs, {ceiling['concurrency']}"
                 f" threads) | manager / worker creates/s | "
                 f"{ceiling['manager']['creates_per_second']} / "
                 f"{ceiling['worker-1']['creates_per_second']} |")
    burst = results["burst"]
    limit = ceiling["limit_creates_per_second"]
    lines.append(f"| burst {burst['jobs']} jobs, {burst['workers']} workers | throughput | "
                 f"{burst['throughput_jobs_per_second']} jobs/s "
                 f"({burst['throughput_jobs_per_second'] / limit:.1%} of ceiling) |")
    lines.append(f"| | latency p50 / p90 / p99 / max ms | {_lat(burst['latency'])} |")
    lines.append(f"| | dispatcher CPU share / peak RSS | {burst['dispatcher']['cpu_share']} / "
                 f"{burst['dispatcher']['peak_rss_mb']} MB |")
    lines.append(f"| | CPU s: {_cpu_groups(burst)} |")
    for step in results["steady"]:
        times, median_of = _repeated(step)
        lines.append(f"| steady {step['rate']} jobs/s for {step['seconds']:g} s"
                     f"{times} ({step['achieved_arrival_rate']} achieved) | latency "
                     f"p50 / p90 / p99 / max ms{median_of} | {_lat(step['latency'])} |")
        lines.extend(_spread_rows(step["latency"], step.get("runs", [])))
        if step.get("cpu"):
            lines.append(f"| | CPU s: {_cpu_groups(step)} |")
        lines.extend(_step_rows(step.get("steps", {}).get("Place")))
        lines.extend(_gc_rows(step.get("steps", {}).get("GC")))
        lines.extend(_slowest_rows(step.get("slowest")))
    under = [s["rate"] for s in results["steady"]
             if s["latency"]["p99_ms"] is not None and s["latency"]["p99_ms"] < 1000
             and not s["missing"]]
    lines.append(f"| steady | highest rate with p99 < 1 s | "
                 f"{max(under) if under else 'none'} jobs/s |")
    sync = results["sync"]
    times, median_of = _repeated(sync)
    lines.append(f"| status sync {sync['jobs']} jobs at {sync['rate']:g}/s{times} | "
                 f"lag p50 / p90 / p99 / max ms{median_of} | {_lat(sync['lag'])} |")
    lines.extend(_spread_rows(sync["lag"], sync.get("runs", [])))
    if sync.get("cpu"):
        lines.append(f"| | CPU s: {_cpu_groups(sync)} |")
    lines.extend(_step_rows(sync.get("steps", {}).get("CopyStatus")))
    lines.extend(_gc_rows(sync.get("steps", {}).get("GC")))
    lines.extend(_sync_slowest_rows(sync.get("slowest"), sync.get("relists")))
    cost = burst["api"]["per_job"]
    lines.append(f"| API cost per dispatched job | manager TrainJob writes / worker TrainJob "
                 f"writes / Event writes | {cost['manager_trainjob_writes']} / "
                 f"{cost['worker_trainjob_writes']} / {cost['manager_event_writes']} |")
    lines.append(f"| | reads (GET+LIST) manager / workers | {cost['manager_reads']} / "
                 f"{cost['worker_reads']} |")
    lines.append(f"| API cost per status change | manager writes | "
                 f"{sync['manager_writes_per_status_change']} |")
    if "constrained" in results:
        tight = results["constrained"]
        use = tight["utilisation"]
        lines.append(f"| constrained {tight['jobs']} jobs ({tight['gpu_jobs']} with GPUs), "
                     f"{tight['workers']} workers of different sizes | makespan / pods stuck "
                     f"unschedulable (longest wait) / copies withdrawn | "
                     f"{tight['makespan_seconds']} s / {tight['pods_unschedulable']}"
                     f"{_longest(tight)} / {tight['copies_withdrawn']} |")
        lines.append("| | mean Node utilisation (cpu, GPUs) while jobs run | "
                     + ", ".join(f"{resource} {share:.0%}" if share is not None
                                 else f"{resource} n/a" for resource, share in use.items())
                     + f" ({tight['finished']} finished, {tight['failed']} failed) |")
    for label, key in (("idle", "idle"), ("burst", "burst"), ("idle", "fill_idle"),
                       ("burst", "fill_burst")):
        item = results["footprint"].get(key)
        if item:
            lines.append(f"| footprint, {item['mirrored_jobs']} mirrored, {label} | RSS peak "
                         f"MB / CPU s per s | {item['peak_rss_mb']} / {item['cpu_share']} |")
    for step in results["scaling"]:
        lines.append(f"| scaling, {step['jobs']} jobs | {step['workers']} workers | "
                     f"{step['throughput_jobs_per_second']} jobs/s (p99 "
                     f"{step['latency']['p99_ms']} ms, dispatcher CPU share "
                     f"{step['dispatcher']['cpu_share']}, machine busy "
                     f"{step['cpu']['host_busy_share']:.0%}) |")
    return "\n".join(lines)


def _step_rows(steps: dict | None) -> list[str]:
    """One row: each step of the reconciles of a scenario, mean wall / mean CPU ms and the
    bucket bound of its wall p99."""
    if not steps:
        return []
    cells = [f"{step} {figures.get('wall_mean_ms', 0):.2f} / {figures.get('cpu_mean_ms', 0):.2f}"
             f" (p99 <= {figures.get('wall_p99_ms_at_most')})"
             for step, figures in steps.items()]
    return ["| | per reconcile, mean wall / CPU ms (wall p99 bucket) | " + "; ".join(cells)
            + " |"]


def _gc_rows(pauses: dict | None) -> list[str]:
    """One row: the dispatcher's garbage collections meanwhile, by generation: how many,
    their total pause and the bucket bound of their p99 (of the longest, up to 100)."""
    if not pauses:
        return []

    def longest(bound: float | None) -> str:
        return f"<= {bound}" if bound is not None else f"> {PAUSE_BUCKETS[-1] * 1000:g}"

    cells = [f"{generation} {figures['count']} / {figures['wall_sum_ms']:.1f} ms "
             f"({longest(figures.get('wall_p99_ms_at_most'))})"
             for generation, figures in pauses.items()]
    return ["| | dispatcher garbage collections: count / total pause (longest bucket) | "
            + "; ".join(cells) + " |"]


def _sync_slowest_rows(slowest: dict | None, relists: dict | None) -> list[str]:
    """One row: the slowest status changes' mean lag as the sum of its segments (the
    median change's beside each), and the caches the dispatcher listed again meanwhile."""
    if not slowest:
        return []
    parts = " + ".join(f"{name} {value:.1f} ({slowest['median_of_all_ms'][name]:.1f})"
                       for name, value in slowest["mean_ms"].items())
    listed = ", ".join(f"{cache} {count:g}" for cache, count in (relists or {}).items())
    return [f"| | slowest {slowest['changes']} of {slowest['of']} changes, mean ms (median "
            f"of all): lag = segments | {slowest['lag_ms']} = {parts}; caches listed again: "
            f"{listed or 'none'} |"]


def _slowest_rows(slowest: dict | None) -> list[str]:
    """One row: the slowest dispatches' mean latency as the sum of its parts, from the
    dispatcher's log of each, and the shares of those parts."""
    if not slowest:
        return []
    parts = slowest["mean_ms"]
    sums = " ".join(f"{'-' if v < 0 else '+'} {abs(v):.1f}" for v in parts.values())
    shares = ", ".join(f"{part} {share:.0%}" for part, share in slowest["shares"].items()
                       if share is not None)
    return [f"| | slowest {slowest['jobs']} of {slowest['of']} dispatches, mean ms: latency "
            f"= {' + '.join(parts)} | {slowest['latency_ms']} = {sums.removeprefix('+ ')}"
            + (f" ({shares})" if shares else "") + " |"]


def _longest(constrained: dict) -> str:
    """" (2.1 s)" after a count of unschedulable pods: how long the worst one waited."""
    longest = constrained.get("longest_unschedulable_seconds")
    return f" ({longest} s)" if longest is not None else ""


# The process groups whose CPU per job the comparison gives, in its tables' order.
CPU_PER_JOB = ("kueue manager", "kueue workers", "dispatcher", "training operators",
               "worker scheduler+jobset+kwok", "manager apiserver+etcd",
               "workers apiserver+etcd")


def _cpu_ms_per_job(burst: dict, group: str | None = None) -> float:
    """CPU ms per submitted job of one process group over a burst (None: every group)."""
    seconds = burst["cpu"]["cpu_seconds"]
    used = seconds[group] if group else sum(v for k, v in seconds.items() if k != "benchmark")
    return round(used * 1000 / burst["jobs"], 1)


def _axis_cell(comparison: dict, key: str, cell) -> str:
    try:
        return str(cell(comparison["contenders"][key]["burst"], comparison))
    except (KeyError, TypeError, IndexError, ZeroDivisionError):
        return "n/a"


def _steady_cell(comparison: dict, key: str, rate: int) -> str:
    """A contender's steady step at ``rate``: latency p50 / p99 ms (dispatched/jobs)."""
    step = next((s for s in comparison["contenders"].get(key, {}).get("steady") or []
                 if s["rate"] == rate), None)
    if step is None:
        return "n/a"
    return (f"{step['latency']['p50_ms']} / {step['latency']['p99_ms']} "
            f"({step['dispatched']}/{step['jobs']})")


def _axis_table(results: dict, axis: list[tuple[int, dict]]) -> str:
    """Each contender's burst figures against the worker count."""
    keys = list(dict.fromkeys(k for _, comparison in axis for k in comparison["contenders"]))
    lines = [f"Across worker counts ({results['mode']}): each contender's burst of "
             f"{results['settings']['compare_jobs']} jobs, per submitted job, and its steady "
             "steps", "",
             "| Contender: figure | " + " | ".join(f"{n} workers" for n, _ in axis) + " |",
             "|---|" + "---|" * len(axis)]
    figures = [
        ("throughput jobs/s (dispatched/jobs)",
         lambda b, c: f"{b['throughput_jobs_per_second']} ({b['dispatched']}/{b['jobs']})"),
        ("latency p50 / p99 ms",
         lambda b, c: f"{b['latency']['p50_ms']} / {b['latency']['p99_ms']}"),
        ("writes per job: manager / workers (all) / workers less running the copies "
         "(JobSets, Jobs, pods) / busiest worker", lambda b, c: " / ".join(str(v) for v in (
             b["api"]["per_job"]["manager_writes_all"], b["api"]["per_job"]["worker_writes_all"],
             round(b["api"]["per_job"]["worker_writes_all"]
                   - b["api"]["per_job"]["worker_writes_running"], 3),
             max(v for k, v in writes_by_apiserver(b).items() if k != "manager")))),
        ("on the workers, per job: TrainJob create / delete requests; Workload create / "
         "delete requests", lambda b, c: _copies_cell(b)),
        ("dry-run requests per job (Kueue's Workload dry-run creates): manager / workers",
         lambda b, c: " / ".join(str(v) for v in dry_runs(b).values())),
        ("CPU ms per job, all processes (" + " / ".join(CPU_PER_JOB) + ")",
         lambda b, c: f"{_cpu_ms_per_job(b)} ("
                   + " / ".join(str(_cpu_ms_per_job(b, g)) for g in CPU_PER_JOB) + ")"),
        ("write bound jobs/s (busiest apiserver)",
         lambda b, c: "{jobs_per_second} ({apiserver})".format(
             **write_bound(b, c.get("ceiling")))),
    ]
    rates = sorted({s["rate"] for _, comparison in axis
                    for m in comparison["contenders"].values() for s in m.get("steady") or []})
    for key in keys:
        title = next(c["contenders"][key]["title"] for _, c in axis if key in c["contenders"])
        for label, cell in figures:
            lines.append(f"| {key} ({title}): {label} | " + " | ".join(
                _axis_cell(comparison, key, cell) for _, comparison in axis) + " |")
        for rate in rates:
            lines.append(f"| {key} ({title}): steady {rate} jobs/s, latency p50 / p99 ms "
                         "(dispatched/jobs) | " + " | ".join(
                             _steady_cell(comparison, key, rate) for _, comparison in axis)
                         + " |")
    return "\n".join(lines)


def _ratio(comparison: dict, key: str, value) -> str:
    """``value`` of contender ``key``'s burst over A's, as "1.23x" (n/a if either is missing
    or A's is 0)."""
    try:
        mine = value(comparison["contenders"][key]["burst"])
        theirs = value(comparison["contenders"]["A"]["burst"])
    except (KeyError, TypeError):
        return "n/a"
    if mine is None or not theirs:
        return "n/a"
    return f"{mine / theirs:.2f}x"


def _ratio_table(axis: list[tuple[int, dict]]) -> str:
    """D/A and C/A per worker count: the burst's throughput, latency, writes, copies and CPU
    per job, and the steady steps' latency."""
    pairs = [(n, key, comparison) for n, comparison in axis for key in ("D", "C")
             if key in comparison["contenders"] and "A" in comparison["contenders"]]
    lines = ["Ratios to A (Kueue AllAtOnce) per worker count, burst figures per submitted "
             "job, and the steady steps' latency", "",
             "| Figure | " + " | ".join(f"{key}/A, {n} workers" for n, key, _ in pairs) + " |",
             "|---|" + "---|" * len(pairs)]

    def per_job(name):
        return lambda b: b["api"]["per_job"][name]

    figures = [
        ("throughput", lambda b: b["throughput_jobs_per_second"]),
        ("latency p50", lambda b: b["latency"]["p50_ms"]),
        ("latency p99", lambda b: b["latency"]["p99_ms"]),
        ("writes per job: manager", per_job("manager_writes_all")),
        ("writes per job: workers", per_job("worker_writes_all")),
        ("writes per job: workers less running the copies",
         lambda b: b["api"]["per_job"]["worker_writes_all"]
         - b["api"]["per_job"]["worker_writes_running"]),
        ("TrainJob create requests on the workers per job",
         lambda b: copies(b)["TrainJob created"]),
        ("TrainJob delete requests on the workers per job",
         lambda b: copies(b)["TrainJob deleted"]),
        ("Workload create requests on the workers per job",
         lambda b: copies(b)["Workload created"]),
        ("Workload delete requests on the workers per job",
         lambda b: copies(b)["Workload deleted"]),
        ("CPU per job, all processes", _cpu_ms_per_job),
    ]
    for label, value in figures:
        lines.append(f"| {label} | " + " | ".join(
            _ratio(comparison, key, value) for _, key, comparison in pairs) + " |")
    rates = sorted({s["rate"] for _, _, comparison in pairs
                    for m in comparison["contenders"].values() for s in m.get("steady") or []})
    for rate in rates:
        for name in ("p50", "p99"):
            lines.append(f"| steady {rate} jobs/s: latency {name} | " + " | ".join(
                _steady_ratio(comparison, key, rate, f"{name}_ms")
                for _, key, comparison in pairs) + " |")
    return "\n".join(lines)


def _steady_ratio(comparison: dict, key: str, rate: int, figure: str) -> str:
    """A steady step's latency ``figure`` of contender ``key`` over A's at ``rate``."""
    def latency(who: str):
        step = next((s for s in comparison["contenders"].get(who, {}).get("steady") or []
                     if s["rate"] == rate), None)
        return step["latency"].get(figure) if step else None

    mine, theirs = latency(key), latency("A")
    return f"{mine / theirs:.2f}x" if mine is not None and theirs else "n/a"


def _copies_cell(burst: dict) -> str:
    made = copies(burst)
    return (f"{made['TrainJob created']} / {made['TrainJob deleted']}; "
            f"{made['Workload created']} / {made['Workload deleted']}")
