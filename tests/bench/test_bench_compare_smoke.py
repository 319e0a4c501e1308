"""The comparison with Kueue MultiKueue at a tiny scale: Kueue's AllAtOnce (A) and this
dispatcher standalone (D) on clusters that all run Kueue, a few jobs each; the run ends,
prints the side-by-side table and writes every contender's figures and its plot. No wait
is allowed for a step's deleted jobs, so every step is cleared by force and every Kueue
restarted before the next one, which must then dispatch as before."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.bench_compare

TINY = ["--quick", "--suite", "compare", "--contenders", "A,D", "--burst-workers", "2",
        "--concurrency", "2", "--compare-jobs", "2", "--compare-rates", "2",
        "--compare-rate-seconds", "1", "--constrained-jobs", "4", "--drain-timeout", "0"]
# Seconds the four constrained jobs take to run to the end on an idle machine, at most.
CONSTRAINED_SECONDS = 60


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory, run_bench, load_aware):
    constrained = ["--constrained-timeout", f"{load_aware(CONSTRAINED_SECONDS):.0f}"]
    return run_bench(TINY + constrained, tmp_path_factory.mktemp("bench-compare"),
                     timeout=480)


def test_each_contender_dispatches_every_job(compare_run):
    _, stdout, results = compare_run
    assert "incomplete" not in results, results["incomplete"]
    contenders = results["comparison"]["contenders"]
    assert list(contenders) == ["A", "D"], list(contenders)
    for key, mine in contenders.items():
        burst = mine["burst"]
        assert (burst["dispatched"], burst["missing"]) == (2, 0), (key, burst)
        assert burst["api"]["per_job"]["worker_writes_all"] > 0, (key, burst["api"])
        # Operators ran the copies: every job's pods were seen running on kwok, and what
        # that wrote on the workers (JobSets, Jobs, pods) is counted apart.
        assert burst["running_latency"]["count"] == 2, (key, burst["running_latency"])
        assert burst["dispatched_never_running"] == 0, (key, burst)
        assert burst["api"]["per_job"]["worker_writes_running"] > 0, (key, burst["api"])
        assert burst["cpu"]["cpu_seconds"]["kueue manager"] > 0, (key, burst["cpu"])
        assert [s["rate"] for s in mine["steady"]] == [2], (key, mine["steady"])
        # The steady step came after the burst's forced clearing and Kueue's restart.
        assert [(s["dispatched"], s["missing"]) for s in mine["steady"]] == [(2, 0)], (
            key, mine["steady"])
        # --drain-timeout 0: every step cleared by force, however fast its deletion went.
        for drain in (burst["drain"], *(s["drain"] for s in mine["steady"])):
            assert not drain["complete"] and drain["forced_seconds"] > 0, (key, drain)
        assert mine["constrained"]["jobs"] == 4, (key, mine["constrained"])
        # Kueue's webhooks see every TrainJob the manager stores, whoever dispatches it.
        hooks = burst["api"]["webhooks"]["manager"]
        assert hooks["calls_per_job"] >= 1 and hooks["ms_per_job"] > 0, (key, hooks)
    # D's constrained jobs run to the end: each one's pods were seen all Running.
    tight = contenders["D"]["constrained"]
    assert tight["running_latency"]["count"] == tight["finished"] == 4, tight
    assert tight["never_all_running"] == 0, tight
    # Kueue queued A's jobs: their latency from quota reservation was timed too.
    assert contenders["A"]["burst"]["latency_from_quota_reserved"]["p99_ms"] is not None
    for text in ("| Figure | A: Kueue AllAtOnce | D: this dispatcher standalone |",
                 "| D's burst throughput >= 2x A's"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"


def test_the_comparison_plot_is_written(compare_run):
    output, _, _ = compare_run
    assert (output / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
