"""The scale suite's figures (``bench.scale``) as a markdown table and a plot against the
Pods per worker."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt

from bench.scale import SHAPES

PLOT = "scale.png"


def _v(value, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        value = f"{value:g}"
    return f"{value}{suffix}"


def _percent(share) -> str:
    return "n/a" if share is None else f"{share:.0%}"  # as bench.report writes it


def _kb(value) -> str:
    return "n/a" if value is None else f"{value / 1024:.1f}"


def _synced(start: dict) -> str:
    """Process start to every worker synced, with the interpreter's start and imports and
    each worker's own sync (the dispatcher's gauge, else its log) beside it."""
    text = _v(start.get("start_to_synced_seconds"))
    parts = []
    if start.get("start_to_starting_seconds") is not None:
        parts.append(f"start-up {start['start_to_starting_seconds']:g}")
    gauge = start.get("gauge_seconds") or start.get("logged_seconds")
    if gauge:
        parts.append(", ".join(f"{w} {s:g}" for w, s in gauge.items()))
    return text + (f" ({'; '.join(parts)})" if parts else "")


def _cpu_table(steady: list[dict]) -> list[str]:
    """Where the machine's CPU went in each dispatch step: the machine's busy share and
    each group of processes' CPU seconds (the churn drivers are this benchmark's)."""
    groups = sorted({group for step in steady
                     for group in ((step.get("cpu") or {}).get("cpu_seconds") or {})})
    if not groups:
        return []
    lines = ["", "Where the CPU went in each dispatch step (CPU seconds; the machine's "
             "busy share of all its cores):", "",
             "| step | machine busy | " + " | ".join(groups) + " |",
             "|---|---|" + "---|" * len(groups)]
    for step in steady:
        cpu = step.get("cpu") or {}
        used = cpu.get("cpu_seconds") or {}
        busy = cpu.get("host_busy_share")
        lines.append(f"| {step['rate']} jobs/s "
                     f"| {_percent(busy)} | "
                     + " | ".join(_v(used.get(group)) for group in groups) + " |")
    return lines


def _pair(figures: dict | None, key: str = "") -> str:
    """``p50 / p99`` of a summary (``figures[key]`` when ``key``)."""
    figures = ((figures or {}).get(key) if key else figures) or {}
    return f"{_v(figures.get('p50_ms'))} / {_v(figures.get('p99_ms'))}"


def _floor_table(results: dict) -> list[str]:
    """The dispatcher's latency beside the floor's at each rate, their writes, and a Pod
    event's way into the room placement reads."""
    floors = {f["rate"]: f for f in results.get("floor") or []}
    if not floors:
        return []
    lines = ["", "Against the floor: after each rate, a plain client with no placement and "
             "no caches made the dispatcher's writes per job (the placement PATCH, the "
             "Placed Event, the copy's create; once the job is deleted, the copy's delete "
             "and the finalizer's removal) at the same rate, on as many threads as the "
             "dispatcher has reconciles, the churn going on (`bench/floor.py`). PATCH and "
             "create: each write's time from its answer's wait, the dispatcher's from its "
             "log. A Pod event's apply: from the dispatcher's capacity handler receiving it "
             "to its change counted in the room placement reads "
             "(`dispatcher_capacity_event_apply_seconds`, interpolated in its buckets): a "
             "change that comes while a placement holds that worker's room is counted as "
             "that placement lets it go; in the handler: what the informer's thread "
             "waited (`dispatcher_capacity_event_handler_seconds`).", "",
             "| rate | dispatched: dispatcher / floor | dispatcher p50 / p99 ms "
             "| floor p50 / p99 ms | ratio p50 / p99 | PATCH p50 / p99 ms: dispatcher, floor "
             "| create p50 / p99 ms: dispatcher, floor | Pod event apply p50 / p99 ms "
             "(events; within 5 ms) | in the handler p50 / p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    ratios = {r["rate"]: r for r in results.get("against_floor") or []}
    for step in results.get("steady_churn") or []:
        under = floors.get(step["rate"])
        if under is None:
            continue
        ratio = ratios.get(step["rate"]) or {}
        mine, base = step.get("writes") or {}, under.get("writes") or {}
        applied = step.get("event_apply") or {}
        lines.append(
            f"| {step['rate']} jobs/s | {step['dispatched']}/{step['jobs']} / "
            f"{under['dispatched']}/{under['jobs']} | {_pair(step['latency'])} "
            f"| {_pair(under['latency'])} | {_v(ratio.get('ratio_p50'))} / "
            f"{_v(ratio.get('ratio_p99'))} | {_pair(mine, 'patch')}, {_pair(base, 'patch')} "
            f"| {_pair(mine, 'create')}, {_pair(base, 'create')} "
            f"| {_pair(applied)} ({applied.get('events', 'n/a')}; "
            f"{_percent(applied.get('within_budget_share'))}) "
            f"| {_pair(applied.get('handler'))} |")
    churn = (results.get("churn") or {}).get("event_apply")
    if churn:
        lines += ["", f"A Pod event's apply during the churn alone (no placement running): "
                  f"p50 / p99 {_pair(churn)} ms over {churn['events']} events, "
                  f"{_percent(churn.get('within_budget_share'))} within 5 ms; in the "
                  f"handler {_pair(churn.get('handler'))} ms."]
    failed = {rate: f for rate, f in floors.items() if f.get("failed") or f.get("missing")}
    for rate, f in failed.items():
        lines.append(f"\nThe floor at {rate} jobs/s: {f['missing']} copies not seen, "
                     f"{f['failed']} failed writes ({'; '.join(f.get('errors') or [])}).")
    return lines


def render(results: dict) -> str:
    """Every figure of a scale run, as markdown tables."""
    workers = results.get("workers")
    lines = [f"## Scale: {workers} workers", "",
             f"{results.get('note', '')}.", ""]
    sizes = results.get("sizes") or []
    lines += ["| Nodes/worker | Pods/worker | Nodes created | Nodes Ready | Pods created "
              "| Pods Running after | fill |",
              "|---|---|---|---|---|---|---|"]
    for size in sizes:
        fill = (size.get("memory") or {}).get("fill") or {}
        lines.append(
            f"| {size['nodes_per_worker']} | {size['pods_per_worker']} "
            f"| {_v(fill.get('nodes_create_seconds'), ' s')} "
            f"({_v(fill.get('nodes_creates_per_second'))}/s) "
            f"| +{_v(fill.get('nodes_ready_wait_seconds'), ' s')} "
            f"| {_v(fill.get('pods_create_seconds'), ' s')} "
            f"({_v(fill.get('pods_creates_per_second'))}/s) "
            f"| +{_v(fill.get('pods_running_wait_seconds'), ' s')} "
            f"| {_v(fill.get('pods_seconds'), ' s')} |")
    lines += ["", "Dispatcher memory (settled RSS, started on the empty workers, after the "
              "Nodes, after the Pods) and start to every worker's caches synced:", "",
              "| Pods/worker | empty MB | + Nodes MB | + Pods MB | peak MB | KB per Node "
              "| KB per Pod | start to synced, s (start-up; each worker) |",
              "|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        memory = size.get("memory") or {}
        full = memory.get("with_pods") or {}
        lines.append(
            f"| {size['pods_per_worker']} "
            f"| {_v((memory.get('empty') or {}).get('settled_rss_mb'))} "
            f"| {_v((memory.get('with_nodes') or {}).get('settled_rss_mb'))} "
            f"| {_v(full.get('settled_rss_mb'))} | {_v(full.get('peak_rss_mb'))} "
            f"| {_kb(memory.get('bytes_per_node'))} | {_kb(memory.get('bytes_per_pod'))} "
            f"| {_synced(full)} |")
    lines += ["", "One placement decision (the dispatcher's logged place step; CPU when "
              "logged), jobs one at a time; the first job of each shape (no kept heap of "
              "that shape yet) against the rest; how busy the machine's cores were "
              "meanwhile:", "",
              "| Pods/worker | shape | pods x request | wall p50 ms | wall p99 ms "
              "| CPU p50 ms | CPU p99 ms | first job: CPU (wall) ms | the rest: CPU p50 / p99 ms "
              "| missing | machine busy |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for shape in SHAPES:
            item = (size.get("placement") or {}).get(shape)
            if not item:
                continue
            request = f"{item['cpu']} cpu" + (f", {item['gpus']} GPU" if item["gpus"] else "")
            cpu = item.get("place_cpu") or {}
            busy = (item.get("machine") or {}).get("host_busy_share")
            first = item.get("first") or {}
            rest = (item.get("rest") or {}).get("place_cpu") or {}
            lines.append(
                f"| {size['pods_per_worker']} | {shape} | {item['pods']} x {request} "
                f"| {_v(item['place_wall']['p50_ms'])} | {_v(item['place_wall']['p99_ms'])} "
                f"| {_v(cpu.get('p50_ms'))} | {_v(cpu.get('p99_ms'))} "
                f"| {_v(first.get('place_cpu_ms'))} ({_v(first.get('place_wall_ms'))}) "
                f"| {_v(rest.get('p50_ms'))} / {_v(rest.get('p99_ms'))} | {item['missing']} "
                f"| {_percent(busy)} |")
    takeover = sizes[-1].get("takeover") if sizes else None
    if takeover:
        lines += ["", f"Standby taking over (leader stopped with SIGTERM, its Lease given "
                  f"up): standby started and synced in "
                  f"{_v(takeover.get('standby_start_to_synced_seconds'), ' s')}; a job "
                  f"created after the stop had its copy "
                  f"{_v(takeover.get('create_to_copy_seconds'), ' s')} later "
                  f"({_v(takeover.get('stop_to_copy_seconds'), ' s')} after the stop "
                  f"signal)."]
    churn = results.get("churn")
    if churn:
        drivers = churn.get("drivers") or {}
        achieved = ", ".join(f"{w} {_v(d.get('achieved_per_second'))}/s"
                             f" ({d.get('errors', 0)} errors)" for w, d in drivers.items())
        target = next(iter(drivers.values()), {}).get("target_per_second")
        lines += ["", f"Pod churn: target {_v(target)}"
                  f" Pods/s per worker, achieved {achieved or 'n/a'}. Dispatcher CPU "
                  f"{_v(churn['idle_cpu_per_second'])} s/s idle, "
                  f"{_v(churn['churn_cpu_per_second'])} s/s churning "
                  f"({_v(churn.get('window_replaced_per_second'))} Pods replaced/s, all "
                  f"workers): the churn costs {_v(churn['cost_cpu_per_second'])} CPU s per s, "
                  f"{_v(churn.get('cpu_ms_per_pod_replaced'))} CPU ms per Pod replaced."]
    steady = results.get("steady_churn") or []
    if steady:
        lines += ["", "Dispatch latency (manager create -> copy on a worker) while the Pods "
                  "churn; each job deleted as soon as its copy was seen, as if jobs ended as "
                  "fast as they arrive (a copy gets no pods here, so its reservation would "
                  "otherwise stay).", "",
                  "| Dispatch during the churn | arrivals/s achieved | dispatched "
                  "| p50 ms | p90 ms | p99 ms | max ms |", "|---|---|---|---|---|---|---|"]
        for step in steady:
            lat = step["latency"]
            lines.append(f"| {step['rate']} jobs/s for {step['seconds']:g} s "
                         f"| {_v(step.get('achieved_arrival_rate'))} "
                         f"| {step['dispatched']}/{step['jobs']} | {_v(lat['p50_ms'])} "
                         f"| {_v(lat['p90_ms'])} | {_v(lat['p99_ms'])} | {_v(lat['max_ms'])} |")
        lines += _cpu_table(steady)
    lines += _floor_table(results)
    budgets = results.get("budgets") or []
    if budgets:
        lines += ["", "| Budget | Measured | Limit | Met |", "|---|---|---|---|"]
        for row in budgets:
            met = {True: "met", False: "MISSED", None: "n/a"}[row["met"]]
            lines.append(f"| {row['budget']} | {_v(row['measured'])} {row['unit']} "
                         f"| {row.get('op', '<')} {row['limit']:g} {row['unit']} | {met} |")
    return "\n".join(lines)


def write_plots(results: dict, output: Path) -> list[Path]:
    """RSS, start to synced and placement p99 against the Pods per worker."""
    sizes = results.get("sizes") or []
    if not sizes:
        return []
    pods = [s["pods_per_worker"] for s in sizes]
    figure, (memory, start, place) = plt.subplots(1, 3, figsize=(15, 4.5))

    def series(path):
        values = []
        for size in sizes:
            value = size
            for key in path:
                value = (value or {}).get(key)
            values.append(value)
        return values

    for label, path in (("settled RSS", ("memory", "with_pods", "settled_rss_mb")),
                        ("peak RSS", ("memory", "with_pods", "peak_rss_mb")),
                        ("Nodes only", ("memory", "with_nodes", "settled_rss_mb")),
                        ("empty workers", ("memory", "empty", "settled_rss_mb"))):
        memory.plot(pods, series(path), marker="o", label=label)
    memory.axhline(600, color="grey", linestyle=":", label="600 MB budget")
    memory.set(title="Dispatcher RSS", xlabel="Pods per worker", ylabel="MB")
    start.plot(pods, series(("memory", "with_pods", "start_to_synced_seconds")), marker="o",
               label="start to caches synced")
    start.axhline(60, color="grey", linestyle=":", label="60 s budget")
    start.set(title="Start to caches synced", xlabel="Pods per worker", ylabel="s")
    for shape in SHAPES:
        place.plot(pods, series(("placement", shape, "place_wall", "p99_ms")), marker="o",
                   label=f"{shape} p99")
    place.axhline(20, color="grey", linestyle=":", label="20 ms budget")
    place.set(title="One placement decision (wall)", xlabel="Pods per worker", ylabel="ms")
    for axis in (memory, start, place):
        if len(pods) > 1:
            axis.set_xscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"Scale: {results.get('workers')} workers")
    figure.tight_layout()
    path = output / PLOT
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return [path]
