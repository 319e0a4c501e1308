"""The benchmark program at a tiny scale: it runs to the end against real clusters, prints
its table and writes every figure, sane, plus valid PNG plots."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

TINY = ["--quick", "--suite", "dispatcher", "--jobs", "4", "--burst-workers", "2",
        "--scaling-workers", "1,2", "--scaling-jobs", "3", "--rates", "5", "--rate-seconds", "1",
        "--step-samples", "6", "--sync-jobs", "4",
        "--fill-to", "20", "--idle-seconds", "1", "--repeats", "2"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _ordered(summary: dict, name: str) -> None:
    values = [summary[k] for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]
    assert all(v is not None and v >= 0 for v in values), f"{name}: {summary}"
    assert values == sorted(values), f"{name}: percentiles out of order: {summary}"


def _repeated(step: dict, summary: dict, name: str) -> None:
    """Two repeats, each after a settle, and the headline p99 over all their samples: a
    nearest-rank p99 of the pooled samples lies between the repeats' own."""
    assert step["repeats"] == 2 and len(step["runs"]) == 2, f"{name}: {step.get('runs')}"
    assert all("settled" in run["settle"] for run in step["runs"]), f"{name}: {step['runs']}"
    # The host's speed, timed before each repeat once the machine was quiet.
    assert all(run["settle"]["reference_ms"] > 0 for run in step["runs"]), step["runs"]
    assert summary["repeats"] == 2, f"{name}: {summary}"
    spread = summary["spread"]["p99_ms"]
    assert spread["min"] <= summary["p99_ms"] <= spread["max"], f"{name}: {summary}"
    assert spread["min"] <= spread["median"] <= spread["max"], f"{name}: {summary}"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG (starts {data[:8]!r})"
    assert data[12:16] == b"IHDR", f"{path.name}: no IHDR chunk first"
    assert data.rstrip(b"\0").endswith(b"IEND\xaeB`\x82"), f"{path.name}: no IEND chunk"
    return struct.unpack(">II", data[16:24])


# The whole module starts clusters of its own (two minutes and more): it runs with make
# bench-smoke, outside make test's budget.
pytestmark = pytest.mark.bench_compare


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, run_bench):
    args = list(TINY)
    reuse = os.environ.get("CLUSTERS_TEST_STATE_DIR")
    if reuse:
        args += ["--state-dir", reuse]
    return run_bench(args, tmp_path_factory.mktemp("bench"), timeout=420)


def test_the_table_is_printed_with_every_section(bench_run):
    _, stdout, results = bench_run
    for text in ("| create ceiling", "| burst 4 jobs, 2 workers | throughput",
                 "| steady 5 jobs/s", "| status sync 4 jobs", "| API cost per dispatched job",
                 "| footprint, 4 mirrored, idle", "| scaling, 3 jobs | 2 workers",
                 "| Target | Measured | Met |", "Host speed: the reference work took",
                 "| dispatch costs 2 writes (manager 1 PATCH, worker 1 create)"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"
    assert (bench_run[0] / "table.md").read_text().strip() in stdout


def test_every_figure_is_there_and_sane(bench_run):
    _, _, results = bench_run
    env = results["environment"]
    assert env["kubernetes"]["gitVersion"].startswith("v1."), env["kubernetes"]
    assert env["cpu_count"] >= 1
    # Its apiservers get every core (the harness alone gives them half), unless the caller
    # said otherwise; of reused clusters it records nothing.
    assert env["go_runtime"] == (None if os.environ.get("CLUSTERS_TEST_STATE_DIR") else {
        "GOGC": os.environ.get("GOGC", "400"),
        "GOMAXPROCS": os.environ.get("GOMAXPROCS", str(os.cpu_count()))}), env["go_runtime"]
    assert env["dispatcher"]["config"]["placement_policy"] == "worst-fit"
    assert env["dispatcher"]["reconcile_workers"] >= 1
    reference = env["reference_work_ms"]
    assert reference["start"] > 0 and reference["end"] > 0, reference
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():  # which code ran, so that runs can be told apart
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        assert env["source"]["commit"] == head, env["source"]

    ceiling = results["ceiling"]
    for cluster in ("manager", "worker-1"):
        assert ceiling[cluster]["creates_per_second"] > 0, ceiling

    burst = results["burst"]
    assert (burst["dispatched"], burst["missing"]) == (4, 0), burst
    assert burst["throughput_jobs_per_second"] > 0, burst
    _ordered(burst["latency"], "burst latency")
    assert len(burst["latency_samples_ms"]) == 4
    assert sum(burst["placements"].values()) == 4, burst["placements"]
    cpu = burst["cpu"]
    assert set(cpu["cpu_seconds"]) >= {"manager apiserver+etcd", "workers apiserver+etcd",
                                       "dispatcher", "benchmark"}, cpu
    assert cpu["cpu_seconds"]["manager apiserver+etcd"] > 0, cpu
    assert 0 < cpu["host_busy_share"] <= 1, cpu

    cost = burst["api"]["per_job"]
    # Counted by the apiservers: the dispatch path's writes per job are all present.
    assert cost["manager_trainjob_patches"] >= 1, cost
    assert cost["worker_trainjob_creates"] >= 1, cost
    assert cost["dispatch_writes"] >= 2, cost
    assert any(row["verb"] == "POST" and row["resource"].startswith("trainjobs.")
               for row in burst["api"]["requests"]["manager"]), burst["api"]["requests"]

    for step in results["steady"]:
        # 5 jobs/s for 1 s would be 5 arrivals; --step-samples 6 makes each repeat 1.2 s.
        assert (step["seconds"], step["jobs"]) == (1.2, 2 * 6), step
        assert (step["dispatched"], step["missing"]) == (step["jobs"], 0), step
        _ordered(step["latency"], f"steady {step['rate']}")
        _repeated(step, step["latency"], f"steady {step['rate']}")
        # The host probe's readings (two a second) during the step's repeats.
        assert step["cpu"]["host_probe_readings"] >= 2, step["cpu"]
        assert 0 <= step["cpu"]["host_slow_share"] <= 1, step["cpu"]
        assert step["cpu"]["host_cache_read_ns"] > 0, step["cpu"]
        # Read from the dispatcher's python_gc_duration_seconds: every step allocates
        # enough for young collections.
        assert step["steps"]["GC"]["gen0"]["count"] >= 1, step["steps"]

    sync = results["sync"]
    # Each repeat writes every copy's status once more, with a reason of its own.
    assert (sync["synced"], sync["missing"]) == (8, 0), sync
    _ordered(sync["lag"], "sync lag")
    _repeated(sync, sync["lag"], "sync")
    assert sync["manager_writes_per_status_change"] >= 1, sync
    # Every change found in the dispatcher's log, its lag split into segments that add up.
    slowest = sync["slowest"]
    assert slowest["of"] == 8, slowest
    assert {"to dispatcher", "queue", "decide", "write", "to benchmark"} <= \
        slowest["mean_ms"].keys(), slowest
    assert abs(sum(slowest["mean_ms"].values()) - slowest["lag_ms"]) < 0.5, slowest
    assert slowest["mean_ms"]["to dispatcher"] >= 0, slowest

    footprint = results["footprint"]
    for key in ("burst", "idle", "fill_burst", "fill_idle"):
        item = footprint[key]
        assert item["peak_rss_mb"] > 10 and item["cpu_seconds"] >= 0, (key, item)
    assert footprint["fill_idle"]["mirrored_jobs"] == 20, footprint["fill_idle"]
    assert "settled" in footprint["fill_idle"]["settle"], footprint["fill_idle"]

    assert [s["workers"] for s in results["scaling"]] == [1, 2]
    for step in results["scaling"]:
        assert step["missing"] == 0 and step["throughput_jobs_per_second"] > 0, step

    names = {row["target"] for row in results["targets"]}
    assert len(names) == 7, names
    assert all(row["met"] in (True, False, None) for row in results["targets"])


def test_a_run_agrees_with_itself(bench_run):
    """``python -m bench.agreement`` on real results: every latency figure of the one
    steady rate and of the sync, each the same on both sides."""
    output, _, _ = bench_run
    done = subprocess.run([sys.executable, "-m", "bench.agreement", str(output),
                           str(output / "results.json")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    for text in ("| steady 5 jobs/s p99 ms |", "| status sync lag p50 ms |",
                 "6 of 6 latency figures agree within 30%."):
        assert text in done.stdout, f"expected {text!r} in:\n{done.stdout}"


def test_host_effect_reads_real_results(bench_run):
    """``python -m bench.host_effect`` on real results: the run three times over, so every
    row costs the same CPU and no correlation can be given."""
    output, _, results = bench_run
    done = subprocess.run([sys.executable, "-m", "bench.host_effect", *[str(output)] * 3],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    p50 = results["sync"]["lag"]["p50_ms"]
    for text in ("### steady 5 jobs/s", "### status sync lag",
                 f"| {output} | ", f" | {p50:g} | ",
                 "| host cache read, ns |",
                 "Correlation with it: p50 n/a, p90 n/a, p99 n/a, the host's cache reads n/a."):
        assert text in done.stdout, f"expected {text!r} in:\n{done.stdout}"


def test_the_plots_are_valid_pngs(bench_run):
    output, _, _ = bench_run
    for name in ("latency.png", "scaling.png"):
        width, height = _png_size(output / name)
        assert width >= 300 and height >= 200, (name, width, height)


def test_a_dispatcher_that_does_not_start_stops_the_run_naming_it_and_its_log(tmp_path):
    """The first dispatcher the run starts refuses its flags: the run stops with exit 1,
    names the dispatcher and its log file, and keeps what it measured before, marked
    incomplete."""
    args = [sys.executable, "-m", "bench", *TINY, "--scaling-workers", "1",
            "--dispatcher-args=--workers 0", "--output", str(tmp_path),
            "--log-level", "warning"]
    reuse = os.environ.get("CLUSTERS_TEST_STATE_DIR")
    if reuse:
        args += ["--state-dir", reuse]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1, (f"expected exit 1, saw {done.returncode}\nstdout:\n"
                                  f"{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}")
    match = re.search(r"error: dispatcher failed to start \(log: (\S+)\)", done.stderr)
    assert match, f"expected the dispatcher and its log named; stderr:\n{done.stderr[-3000:]}"
    log_file = Path(match.group(1))
    assert "--workers" in log_file.read_text(), log_file.read_text()[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["incomplete"].startswith("dispatcher failed to start"), results
    assert results["ceiling"]["manager"]["creates_per_second"] > 0, results["ceiling"]
