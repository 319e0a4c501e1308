"""The scale suite at a tiny scale: two workers of 10 kwok Nodes and 100 Pods each (after
a smaller size of the growth axis), every figure measured and printed: the fill, the
dispatcher's memory per Node and per Pod, its start, one placement decision per shape, a
standby taking over, the Pod churn's CPU cost, dispatch latency during the churn, the
budgets, and the plot."""

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
    assert [row["met"] in (True, False) for row in results["budgets"]] == [True] * 5, \
        results["budgets"]


def test_the_table_and_the_plot(scale_run):
    output, stdout, _ = scale_run
    for text in ("## Scale: 2 workers", "| Nodes/worker | Pods/worker |",
                 "| KB per Node | KB per Pod |", "| 100 | gpu | 1 x 16 cpu, 8 GPU |",
                 "Standby taking over", "Pod churn: target 5 Pods/s per worker",
                 "| 5 jobs/s for 2 s |", "| step | machine busy |", " dispatcher |",
                 "| CPU p99 ms | missing | machine busy |",
                 "| Budget | Measured | Limit | Met |",
                 "copies get no pods"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"
    data = (output / "scale.png").read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 200, (width, height)
