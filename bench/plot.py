"""PNG plots of a run: latency distributions and throughput against workers."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from bench.report import copies


def _cdf(axis, samples_ms: list[float], label: str) -> None:
    values = sorted(samples_ms)
    if not values:
        return
    fractions = [(i + 1) / len(values) for i in range(len(values))]
    axis.step(values, fractions, where="post", label=f"{label} (n={len(values)})")


def _log_ms_axis(axis) -> None:
    axis.set_xscale("log")
    axis.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    axis.xaxis.set_minor_formatter(NullFormatter())


def latency_plot(results: dict, path: Path) -> Path:
    figure, (dispatch, sync) = plt.subplots(1, 2, figsize=(12, 4.5))
    _cdf(dispatch, results["burst"]["latency_samples_ms"],
         f"burst of {results['burst']['jobs']}")
    for step in results["steady"]:
        _cdf(dispatch, step["latency_samples_ms"], f"steady {step['rate']} jobs/s")
    dispatch.set(title="Dispatch latency (manager ADDED -> remote ADDED)", xlabel="ms",
                 ylabel="fraction of jobs")
    _log_ms_axis(dispatch)
    dispatch.axvline(100, color="grey", linestyle=":", label="100 ms target")
    dispatch.legend(fontsize=8)
    dispatch.grid(alpha=0.3)
    _cdf(sync, results["sync"]["lag_samples_ms"], "remote status write -> manager shows it")
    sync.set(title="Status-sync lag", xlabel="ms", ylabel="fraction of jobs")
    _log_ms_axis(sync)
    sync.axvline(100, color="grey", linestyle=":", label="100 ms target")
    sync.legend(fontsize=8)
    sync.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def scaling_plot(results: dict, path: Path) -> Path:
    steps = results["scaling"]
    ceiling = results["ceiling"]
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    axis.plot([s["workers"] for s in steps], [s["throughput_jobs_per_second"] for s in steps],
              marker="o", label="dispatch throughput")
    axis.axhline(ceiling["manager"]["creates_per_second"], color="tab:red", linestyle="--",
                 label="create ceiling, manager")
    axis.axhline(ceiling["worker-1"]["creates_per_second"], color="tab:orange",
                 linestyle=":", label="create ceiling, worker")
    axis.set(title="Burst throughput against workers", xlabel="workers", ylabel="jobs/s",
             ylim=(0, None))
    axis.set_xticks([s["workers"] for s in steps])
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def comparison_plot(results: dict, path: Path) -> Path:
    """Per contender: burst latency distribution, burst throughput and constrained
    makespan, side by side."""
    contenders = results["comparison"]["contenders"]
    figure, (latency, throughput, makespan) = plt.subplots(1, 3, figsize=(15, 4.5))
    for key, mine in contenders.items():
        if "burst" in mine:
            _cdf(latency, mine["burst"]["latency_samples_ms"], f"{key}: {mine['title']}")
    latency.set(title="Burst: create -> remote copy exists", xlabel="ms",
                ylabel="fraction of jobs")
    _log_ms_axis(latency)
    if latency.get_legend_handles_labels()[0]:  # no burst ran: nothing to label
        latency.legend(fontsize=7)
    latency.grid(alpha=0.3)
    keys = list(contenders)
    throughput.bar(keys, [(contenders[k].get("burst") or {}).get("throughput_jobs_per_second")
                          or 0 for k in keys], color="tab:blue")
    throughput.set(title="Burst throughput", ylabel="jobs/s")
    throughput.grid(alpha=0.3, axis="y")
    makespan.bar(keys, [(contenders[k].get("constrained") or {}).get("makespan_seconds")
                        or 0 for k in keys], color="tab:green")
    makespan.set(title="Constrained placement: makespan (0: not finished)", ylabel="s")
    makespan.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def workers_axis_plot(results: dict, path: Path) -> Path:
    """Per contender against the worker count: API writes per job on the manager and on the
    workers, and the Workloads created on the workers per job (a burst's, per submitted
    job); D's and C's writes and CPU per job as a ratio to A's."""
    axis = sorted((int(n), f["comparison"]) for n, f in results["workers_axis"].items()
                  if (f.get("comparison") or {}).get("contenders"))
    keys = list(dict.fromkeys(k for _, c in axis for k in c["contenders"]))
    figure, panels = plt.subplots(1, 4, figsize=(20, 4.5))
    shown = ((lambda b: b["api"]["per_job"]["manager_writes_all"],
              "Manager apiserver: writes per job"),
             (lambda b: b["api"]["per_job"]["worker_writes_all"],
              "Worker apiservers (all): writes per job"),
             # The Workloads a dispatcher has made on the workers: AllAtOnce's grow with them.
             (lambda b: copies(b)["Workload created"],
              "Workers: Workload create requests per job"))
    for panel, (value, title) in zip(panels[:3], shown, strict=True):
        for key in keys:
            points = [(n, value(c["contenders"][key]["burst"]))
                      for n, c in axis
                      if "burst" in c["contenders"].get(key, {})]
            points = [(n, v) for n, v in points if v is not None]
            if points:
                title_of = next(c["contenders"][key]["title"] for _, c in axis
                                if key in c["contenders"])
                panel.plot(*zip(*points, strict=True), marker="o", label=f"{key}: {title_of}")
        panel.set(title=title, xlabel="workers", ylabel="per submitted job", ylim=(0, None))
        panel.set_xticks([n for n, _ in axis])
        if panel.get_legend_handles_labels()[0]:
            panel.legend(fontsize=7)
        panel.grid(alpha=0.3)
    ratio = panels[3]

    def writes(burst: dict) -> float:
        per_job = burst["api"]["per_job"]
        return per_job["manager_writes_all"] + per_job["worker_writes_all"]

    def cpu(burst: dict) -> float:
        return sum(v for k, v in burst["cpu"]["cpu_seconds"].items() if k != "benchmark")

    for key, colour in (("D", "tab:red"), ("C", "tab:green")):
        for value, style, what in ((writes, "-", "writes"), (cpu, "--", "CPU")):
            points = [(n, value(c["contenders"][key]["burst"])
                       / value(c["contenders"]["A"]["burst"]))
                      for n, c in axis
                      if "burst" in c["contenders"].get(key, {})
                      and "burst" in c["contenders"].get("A", {})
                      and value(c["contenders"]["A"]["burst"])]
            if points:
                ratio.plot(*zip(*points, strict=True), marker="o", linestyle=style, color=colour,
                           label=f"{key}/A, {what} per job")
    ratio.axhline(1, color="grey", linestyle=":")
    ratio.set(title="Ratio to A per job: writes (solid), CPU (dashed)",
              xlabel="workers", ylabel="ratio", ylim=(0, None))
    ratio.set_xticks([n for n, _ in axis])
    if ratio.get_legend_handles_labels()[0]:
        ratio.legend(fontsize=7)
    ratio.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write_plots(results: dict, output: Path) -> list[Path]:
    """Every plot the run's figures allow."""
    plots = []
    if "burst" in results and "sync" in results:
        plots.append(latency_plot(results, output / "latency.png"))
    if "scaling" in results and "ceiling" in results:
        plots.append(scaling_plot(results, output / "scaling.png"))
    if results.get("comparison", {}).get("contenders"):
        plots.append(comparison_plot(results, output / "comparison.png"))
    if any((f.get("comparison") or {}).get("contenders")
           for f in (results.get("workers_axis") or {}).values()):
        plots.append(workers_axis_plot(results, output / "workers-axis.png"))
    return plots
