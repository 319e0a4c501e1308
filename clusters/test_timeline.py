"""Where a test run's time goes: each module's wall time in each pytest process, and how
long each process sat idle at the end while another still ran (a pytest plugin).

`make test` runs its modules in two pytest-xdist processes; the run lasts as long as the
busier one. Each test's reports (setup, call, teardown) carry their start and stop times
and the process that ran them, so the controlling process can tell, at the end:

* per process: the span from its first test's start to its last test's end, and the idle
  time after it until the run's last test ended (the imbalance);
* per module (or shared unit): the process, when it started (seconds into the run: with
  the machine's CPU over time, what ran when it idled), its wall time from first start to
  last stop; the longest few are printed, all of them go to ``test-artifacts/test-timeline.json``;
* for the machine: the CPU seconds a fixed piece of Python work took at the start and at
  the end (``cpu_probe``), and the CPU the processes the run started and reaped used. The
  same work costs up to a quarter more CPU on a shared machine at some hours than at
  others; these figures tell whether a slower run did more work or ran on a slower machine.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUTPUT = Path("test-artifacts") / "test-timeline.json"
PRINTED = 12


def cpu_probe(rounds: int = 3) -> float:
    """CPU seconds a fixed piece of pure-Python work takes (the best of ``rounds``): how fast
    this machine runs one thread now (0.08-0.1 s on the machine docs/testing.md measured)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        sum(i * i for i in range(2_000_000))
        best = min(best, time.process_time() - start)
    return best


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def report_process(report: pytest.TestReport) -> str:
    """The pytest process that ran a report's test: xdist's worker id (gw0, gw1), or "main"
    in a run without workers."""
    node = getattr(report, "node", None)  # pytest-xdist: the worker that sent the report
    return getattr(getattr(node, "gateway", None), "id", None) or \
        os.environ.get("PYTEST_XDIST_WORKER", "main")


class Timeline:
    def __init__(self) -> None:
        # (process, module) -> [first start, last stop]
        self.spans: dict[tuple[str, str], list[float]] = {}
        # Only the controlling process sums up; its machine figures count xdist's workers,
        # its children, and what they reaped.
        self.controlling = "PYTEST_XDIST_WORKER" not in os.environ
        if self.controlling:
            self.probe_at_start = cpu_probe()
            self.children_cpu_at_start = children_cpu_seconds()

    def machine(self) -> dict:
        return {"cpu_probe_seconds_at_start": round(self.probe_at_start, 3),
                "cpu_probe_seconds_at_end": round(cpu_probe(), 3),
                "reaped_processes_cpu_seconds": round(
                    children_cpu_seconds() - self.children_cpu_at_start, 1)}

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is None or stop is None:
            return
        process = report_process(report)
        module = report.nodeid.split("::", 1)[0]
        span = self.spans.setdefault((process, module), [start, stop])
        span[0], span[1] = min(span[0], start), max(span[1], stop)

    def summary(self) -> dict:
        """Per process its span and idle tail; per module its process and wall seconds."""
        if not self.spans:
            return {}
        by_process: dict[str, list[float]] = defaultdict(lambda: [float("inf"), 0.0])
        for (process, _), (start, stop) in self.spans.items():
            span = by_process[process]
            span[0], span[1] = min(span[0], start), max(span[1], stop)
        first = min(start for start, _ in by_process.values())
        last = max(stop for _, stop in by_process.values())
        return {
            "run_seconds": round(last - first, 1),
            "processes": {process: {"seconds": round(stop - start, 1),
                                    "idle_at_end_seconds": round(last - stop, 1)}
                          for process, (start, stop) in sorted(by_process.items())},
            "modules": sorted(({"module": module, "process": process,
                                "started_at_seconds": round(start - first, 1),
                                "seconds": round(stop - start, 1)}
                               for (process, module), (start, stop) in self.spans.items()),
                              key=lambda row: -row["seconds"]),
        }

    def pytest_terminal_summary(self, terminalreporter) -> None:
        summary = self.summary() if self.controlling else {}
        if not summary:
            return
        summary["machine"] = machine = self.machine()
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(json.dumps(summary, indent=2) + "\n")
        write = terminalreporter.write_line
        terminalreporter.section("time per pytest process")
        for process, figures in summary["processes"].items():
            write(f"{process}: {figures['seconds'] / 60:.1f} min of tests, idle "
                  f"{figures['idle_at_end_seconds'] / 60:.1f} min at the end")
        write(f"machine: a fixed piece of Python work took "
              f"{machine['cpu_probe_seconds_at_start']:.3f} s of CPU at the start and "
              f"{machine['cpu_probe_seconds_at_end']:.3f} s at the end; the processes the run "
              f"started and reaped used {machine['reaped_processes_cpu_seconds'] / 60:.1f} "
              "CPU-min (containers not included)")
        write(f"longest modules (all in {OUTPUT}):")
        for row in summary["modules"][:PRINTED]:
            write(f"  {row['seconds'] / 60:5.1f} min  {row['process']}  {row['module']}")


def pytest_configure(config) -> None:
    config.pluginmanager.register(Timeline(), "test-timeline")
