"""The scale suite at a tiny scale: two workers of 10 kwok Nodes and 100 Pods each (after
a smaller size of the growth axis), every figure measured and printed: the fill, the
dispatcher's memory per Node and per Pod, its start, one placement decision per shape (the
first job against the rest), a standby taking over, the Pod churn's CPU cost, dispatch
latency during the churn beside the floor's, a Pod event's apply, the budgets, and the
plot."""

from __future__ import annotations

import struct

import pytest

pytestmark = pytest.mark.bench_compare

TINY = ["--quick", "--suite", "scale", "--scale-nodes", "10", "--scale-pods", "100",
        "--scale-axis", "10:40", "--scale-placement-jobs", "3", "--scale-rates", "5",
        "--scale-rate-seconds", "2", "--scale-window-seconds", "2", "--scale-churn-rate", "5",
        "--concurrency", "4"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def scale_run(tmp_path_factory, run_bench):
    return run_bench(TINY, tmp_path_factory.mktemp("bench-scale"), timeout=600)


def test_every_size_is_filled_and_measured(scale_run):
    _, _, results = scale_run
    assert "incomplete" not in results, results["incomplete"]
    sizes = results["sizes"]
    assert [(s["nodes_per_worker"], s["pods_per_worker"]) for s in sizes] == \
        [(10, 40), (10, 100)], sizes
    for size in sizes:
        memory = size["memory"]
        fill = memory["fill"]
        # Both workers' Nodes and Pods, every Pod Running (kwok) before the figures.
        assert (fill["nodes"], fill["pods"]) == (20, 2 * size["pods_per_worker"]), fill
        assert fill["pods_creates_per_second"] > 0, fill
        for stage in ("empty", "with_nodes", "with_pods"):
            assert memory[stage]["settled_rss_mb"] > 10, (stage, memory[stage])
            assert memory[stage]["start_to_synced_seconds"] > 0, (stage, memory[stage])
        assert memory["with_pods"]["peak_rss_mb"] >= memory["with_pods"]["settled_rss_mb"] \
            * 0.9, memory["with_pods"]
        assert memory["bytes_per_node"] is not None and memory["bytes_per_pod"] is not None
        for shape in ("small", "wide", "gpu"):
            item = size["placement"][shape]
            assert (item["jobs"], item["missing"], item["logged"]) == (3, 0, 3), (shape, item)
            wall = item["place_wall"]
            assert 0 < wall["p50_ms"] <= wall["p99_ms"] <= wall["max_ms"], (shape, wall)
            # The first job of the shape apart from the other two.
            assert item["first"]["place_cpu_ms"] > 0, (shape, item["first"])
            assert item["rest"]["place_cpu"]["count"] == 2, (shape, item["rest"])
        assert size["placement"]["gpu"]["gpus"] == 8, size["placement"]["gpu"]


def test_takeover_churn_and_budgets(scale_run):
    _, _, results = scale_run
    takeover = results["sizes"][-1]["takeover"]
    assert takeover["dispatched"], takeover
    assert "standby" in takeover["standby_readyz"], takeover
    assert takeover["create_to_copy_seconds"] > 0, takeover
    churn = results["churn"]
    for worker, driver in churn["drivers"].items():
        assert driver["replaced"] > 0 and driver["errors"] == 0, (worker, driver)
    assert churn["churn"]["cpu_seconds"] >= 0 and churn["idle"]["wall_seconds"] >= 2, churn
    (step,) = results["steady_churn"]
    assert (step["rate"], step["missing"]) == (5, 0) and step["dispatched"] == 10, step
    assert step["writes"]["create"]["count"] == 10, step["writes"]
    # The floor at the same rate: every job given the dispatcher's writes, and torn down.
    (under,) = results["floor"]
    assert (under["rate"], under["dispatched"], under["missing"], under["failed"]) == \
        (5, 10, 0, 0), under
    assert under["torn_down"] == 10 and under["events_written"] == 10, under
    (row,) = results["against_floor"]
    assert row["ratio_p99"] == round(step["latency"]["p99_ms"] / under["latency"]["p99_ms"],
                                     2), row
    # The churn's Pod events counted by the capacity handler, with and without placements.
    for applied in (step["event_apply"], churn["event_apply"]):
        assert applied["events"] > 0, applied
        assert 0 <= applied["p50_ms"] <= applied["p99_ms"], applied
        assert 0 < applied["within_budget_share"] <= 1, applied
        # The same changes, give or take those still waiting at a reading.
        assert applied["handler"]["events"] > 0, applied
    # Every budget measured: the five, the floor's at the one rate, the event apply, the
    # wide job's CPU and the first job of a shape.
    assert [row["met"] in (True, False) for row in results["budgets"]] == [True] * 9, \
        results["budgets"]


def test_the_table_and_the_plot(scale_run):
    output, stdout, _ = scale_run
    for text in ("## Scale: 2 workers", "| Nodes/worker | Pods/worker |",
                 "| KB per Node | KB per Pod |", "| 100 | gpu | 1 x 16 cpu, 8 GPU |",
                 "Standby taking over", "Pod churn: target 5 Pods/s per worker",
                 "| 5 jobs/s for 2 s |", "| step | machine busy |", " dispatcher |",
                 "| missing | machine busy |",
                 "| Budget | Measured | Limit | Met |",
                 "| first job: CPU (wall) ms | the rest: CPU p50 / p99 ms |",
                 "Against the floor", "| ratio p50 / p99 |", "| 5 jobs/s | 10/10 / 10/10 |",
                 "A Pod event's apply during the churn alone",
                 "against the floor's", "x the floor | <= 1.25 x the floor |",
                 "copies get no pods"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"
    data = (output / "scale.png").read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 200, (width, height)
