"""``python -m bench.commits``: the side-by-side table of two commits' runs, and its
refusals, without running a benchmark."""

from __future__ import annotations

import subprocess
import sys

from bench import commits


def _results(reference: float, sync_p99: float, steady_p99: float) -> dict:
    cpu = {"cpu_seconds": {"dispatcher": 1.0, "manager": 1.0}}
    return {
        "environment": {"reference_work_ms": {"start": reference, "end": reference}},
        "burst": {"throughput_jobs_per_second": 70.0},
        "steady": [{"rate": 50, "latency": {"p50_ms": 20.0, "p90_ms": 40.0,
                                             "p99_ms": steady_p99},
                    "dispatched": 500, "cpu": cpu}],
        "sync": {"lag": {"p50_ms": 15.0, "p90_ms": 30.0, "p99_ms": sync_p99}, "synced": 500,
                 "cpu": cpu, "slowest": {"mean_ms": {"to dispatcher": 300.0}}},
    }


def test_the_table_gives_each_run_the_medians_and_the_ratio_b_over_a():
    runs = {"A": [_results(30, 90, 120), _results(32, 110, 130)],
            "B": [_results(31, 400, 125), _results(33, 600, 135)]}
    for older in runs["A"]:
        del older["sync"]["slowest"]  # a commit from before the dispatcher logged it
    rows = {line.split(" | ")[0].removeprefix("| "): line
            for line in commits.table(("A", "B"), runs).splitlines()}
    # The sync's p99: A's runs 90 and 110 (median 100), B's 400 and 600 (500): 5 times.
    assert rows["status sync lag p99 ms"].endswith("| 90 | 110 | 400 | 600 | 100 | 500 | 5.00 |")
    # The host's reference work beside it: about the same, so the code moved the figure.
    assert rows["host reference work at start, CPU ms"].endswith("| 31 | 32 | 1.03 |")
    assert rows["steady 50 jobs/s: machine CPU per unit, ms"].endswith("| 1.00 |")
    # Only B has the breakdown here: no ratio.
    assert rows["status sync slowest 1 %: to dispatcher ms"].endswith(
        "| - | - | 300 | 300 | - | 300 | - |")


def test_an_unknown_commit_is_refused_by_name():
    done = subprocess.run([sys.executable, "-m", "bench", "--compare-commits", "HEAD",
                           "no-such-commit-here"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "no-such-commit-here: not a commit" in done.stderr, done.stderr


def test_each_runs_output_is_chosen_by_the_comparison():
    done = subprocess.run([sys.executable, "-m", "bench.commits", "HEAD", "HEAD", "--",
                           "--quick", "--output", "x"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--output after --" in done.stderr, done


def test_options_before_the_separator_are_the_comparisons_own(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.commits", "HEAD", "no-such-commit",
                           "--rounds", "1", "--output", str(tmp_path), "--", "--quick"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no-such-commit: not a commit" in done.stderr, done
