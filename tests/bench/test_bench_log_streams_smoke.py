"""The log-streams suite at a tiny scale: one worker, 5 jobs/s for 2 s plain and with two
users following logs through the manager's aggregation layer to the dispatcher, whose
bound on relayed logs is one: one stream flows (its lines counted), the other is refused
with 429, and both runs' latency and CPU per job are printed with their ratio."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.bench_compare

TINY = ["--quick", "--suite", "log-streams", "--burst-workers", "1", "--log-streams", "2",
        "--log-streams-rate", "5", "--rate-seconds", "2", "--step-samples", "6",
        "--repeats", "1", "--concurrency", "4", "--log-lines-per-second", "20",
        "--dispatcher-args=--remote-api-max-streams 1"]


@pytest.fixture(scope="module")
def streams_run(tmp_path_factory, run_bench):
    return run_bench(TINY, tmp_path_factory.mktemp("bench-log-streams"), timeout=420)


def test_both_runs_are_timed_and_compared(streams_run):
    _, _, results = streams_run
    assert "incomplete" not in results, results["incomplete"]
    assert results["remote_view"]["max_streams"] == 1, results["remote_view"]
    figures = results["log_streams"]
    assert (figures["rate"], figures["repeats"], figures["streams"]) == (5, 1, 2), figures
    for way in ("plain", "with_streams"):
        part = figures[way]
        assert (part["jobs"], part["dispatched"], part["missing"]) == (10, 10, 0), (way, part)
        latency = part["latency"]
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"], (way, latency)
        assert part["dispatcher_cpu_ms_per_job"] > 0, (way, part)
    ratio = figures["ratio"]
    assert ratio["p99"] == round(figures["with_streams"]["latency"]["p99_ms"]
                                 / figures["plain"]["latency"]["p99_ms"], 2), ratio
    assert ratio["p50"] > 0 and ratio["cpu_per_job"] > 0, ratio


def test_one_stream_flows_and_the_one_beyond_the_bound_gets_429(streams_run):
    _, _, results = streams_run
    streams = results["log_streams"]["with_streams"]["streams"]
    assert (streams["requested"], streams["opened"], streams["refused_429"],
            streams["refused"], streams["ended_early"]) == (2, 1, 1, {"429": 1}, 0), streams
    (run,) = results["log_streams"]["with_streams"]["runs"]
    assert any("--remote-api-max-streams" in m for m in run["streams"]["refusal_messages"]), \
        run["streams"]
    # The open stream received the lines written while the jobs arrived (each about 80
    # bytes), through the aggregator and the dispatcher.
    arrived = run["streams"]["while_jobs_arrived"]
    assert arrived["streams_receiving"] == 1 and arrived["lines"] > 0, arrived
    assert streams["bytes"] > 50 * streams["lines"] > 0, streams
    assert streams["alone_lines_per_second"] > 0, streams


def test_the_table(streams_run):
    output, stdout, _ = streams_run
    for text in ("## Dispatch at 5 jobs/s with 2 log streams following, against without",
                 "--remote-api-max-streams 1", "| plain |", "| 2 log streams following |",
                 "| with / without |", "| refused 429 (all runs) | 1 |",
                 "| opened (each run) | 1 of 2 |", "dispatcher CPU ms/job"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"
    assert (output / "table.md").read_text().strip() in stdout
