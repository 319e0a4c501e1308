"""The comparison's workers axis at a tiny scale: Kueue's AllAtOnce (A) and this dispatcher
standalone (D), a burst of two jobs each at 1 and then 2 workers, each count on clusters of
its own; the run prints a table per count, the figures across counts and the ratios D/A,
and plots writes per job against the workers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.bench_compare

TINY = ["--quick", "--suite", "compare", "--contenders", "A,D", "--workers-axis", "1,2",
        "--compare-scenarios", "burst", "--concurrency", "2", "--compare-jobs", "2",
        "--drain-timeout", "0"]


@pytest.fixture(scope="module")
def axis_run(tmp_path_factory, run_bench):
    return run_bench(TINY, tmp_path_factory.mktemp("bench-compare-axis"), timeout=600)


def test_each_worker_count_runs_every_contender_on_its_own_clusters(axis_run):
    from bench.report import copies, dry_runs

    _, _, results = axis_run
    assert "incomplete" not in results, results["incomplete"]
    assert "comparison" not in results, "the axis replaces the single comparison"
    axis = results["workers_axis"]
    assert sorted(axis) == ["1", "2"], list(axis)
    for count, figures in axis.items():
        contenders = figures["comparison"]["contenders"]
        assert list(contenders) == ["A", "D"], (count, list(contenders))
        for key, mine in contenders.items():
            burst = mine["burst"]
            assert (burst["workers"], burst["dispatched"], burst["missing"]) == (
                int(count), 2, 0), (count, key, burst)
            servers = burst["api"]["writes_per_job_by_apiserver"]
            assert list(servers) == ["manager"] + [f"worker-{i}" for i in
                                                   range(1, int(count) + 1)], servers
            assert burst["cpu"]["cpu_seconds"]["kueue manager"] > 0, (count, key, burst["cpu"])
        # D writes one TrainJob copy per job wherever it places it.
        assert copies(contenders["D"]["burst"])["TrainJob created"] == 1.0, (
            count, contenders["D"]["burst"]["api"]["requests"])
        # AllAtOnce copies each job's Workload to every worker.
        made = copies(contenders["A"]["burst"])
        assert made["Workload created"] >= int(count), (count, made)
        # The worker holding a copy runs Kueue's job reconciler on it, which dry-run-creates
        # its Workload: counted apart, not as Workloads created. D's copies are not Kueue's.
        assert dry_runs(contenders["A"]["burst"])["workers"] > 0, (
            count, contenders["A"]["burst"]["api"]["requests"])
        assert dry_runs(contenders["D"]["burst"])["workers"] == 0, (
            count, contenders["D"]["burst"]["api"]["requests"])


def test_the_report_gives_each_count_the_ratios_and_the_plot(axis_run):
    output, stdout, results = axis_run
    for text in ("the same 1 workers", "the same 2 workers",
                 "| Contender: figure | 1 workers | 2 workers |",
                 "| Figure | D/A, 1 workers | D/A, 2 workers |",
                 "| 2 workers: D's burst throughput >= 50% of the apiservers' write bound"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"
    assert not any("of the create ceiling" in row["target"] for row in results["targets"]), (
        results["targets"])
    assert (output / "workers-axis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
