"""The scale suite's arithmetic for the floor, a Pod event's apply and the first job of a
shape, and how the budgets judge them (no clusters: figures in, figures out)."""

from __future__ import annotations

import math

from bench import scale, scale_report

INF = math.inf


def test_the_event_apply_percentiles_are_those_of_the_events_between_the_readings():
    before = {0.001: 10.0, 0.005: 10.0, 0.01: 10.0, INF: 10.0}
    # 100 events since: 90 within 1 ms, 8 more within 5 ms, 2 between 5 and 10 ms.
    after = {0.001: 100.0, 0.005: 108.0, 0.01: 110.0, INF: 110.0}
    figures = scale.apply_figures(before, after)
    assert figures["events"] == 100 and figures["within_budget_share"] == 0.98, figures
    # p50: the 50th of 90 events in [0, 1 ms]; p99: the 99th, the first of the two in
    # (5, 10] ms, half-way through that bucket.
    assert figures["p50_ms"] == round(50 / 90, 3), figures
    assert figures["p99_ms"] == 7.5, figures
    assert scale.apply_figures(before, before)["events"] == 0
    assert scale.apply_figures(None, after) is None  # a dispatcher without the histogram


def test_the_handlers_own_time_is_given_beside_the_apply():
    before = {scale.APPLY_HISTOGRAM: {0.005: 0.0, INF: 0.0},
              scale.HANDLER_HISTOGRAM: {0.005: 0.0, INF: 0.0}}
    after = {scale.APPLY_HISTOGRAM: {0.005: 3.0, INF: 4.0},
             scale.HANDLER_HISTOGRAM: {0.005: 4.0, INF: 4.0}}
    figures = scale.event_figures(before, after)
    assert (figures["events"], figures["within_budget_share"]) == (4, 0.75), figures
    assert figures["handler"]["within_budget_share"] == 1.0, figures
    assert scale.event_figures(None, after) is None


def test_beyond_the_last_bound_the_percentile_is_that_bound():
    figures = scale.apply_figures({}, {0.001: 1.0, 0.005: 1.0, INF: 4.0})
    assert (figures["p50_ms"], figures["p99_ms"], figures["within_budget_share"]) == \
        (5.0, 5.0, 0.25), figures


def test_the_first_job_of_a_shape_is_set_apart_from_the_rest():
    logged = {("ns", "wide-0000"): {"place": 0.004, "place_cpu": 0.003},
              ("ns", "wide-0001"): {"place": 0.002, "place_cpu": 0.001},
              ("ns", "wide-0002"): {"place": 0.003, "place_cpu": 0.002}}
    figures = scale.first_and_rest(logged, ("ns", "wide-0000"))
    assert figures["first"] == {"place_wall_ms": 4.0, "place_cpu_ms": 3.0}, figures
    assert figures["rest"]["place_cpu"]["count"] == 2, figures
    assert figures["rest"]["place_cpu"]["p99_ms"] == 2.0, figures


def _results(floor_p99: float, apply_share: float, first_cpu: float) -> dict:
    steady = [{"rate": rate,
               "latency": {"p50_ms": 20.0, "p90_ms": 50.0, "p99_ms": 100.0, "max_ms": 120.0},
               "event_apply": {"events": 50, "p50_ms": 0.1, "p99_ms": 4.0 if apply_share >= 0.99
                               else 9.0, "within_budget_share": apply_share}}
              for rate in (10, 50)]
    floors = [{"rate": rate, "latency": {"p50_ms": 10.0, "p99_ms": floor_p99}}
              for rate in (10, 50)]
    placement = {"wide": {"pods": 32, "cpu": "8", "gpus": 0, "missing": 0,
                          "place_wall": {"p50_ms": 6.0, "p99_ms": 12.0},
                          "place_cpu": {"p99_ms": 8.0},
                          "first": {"place_cpu_ms": first_cpu},
                          "rest": {"place_cpu": {"p99_ms": 8.0}}}}
    return {"workers": 2, "steady_churn": steady, "floor": floors,
            "against_floor": scale.against_floor(steady, floors),
            "sizes": [{"nodes_per_worker": 1000, "pods_per_worker": 20000,
                       "placement": placement}]}


def _judged(results: dict) -> dict[str, bool | None]:
    return {row["budget"].split(" (")[0]: row["met"] for row in scale.budgets(results)}


def test_the_budgets_against_the_floor_the_event_apply_and_the_first_job():
    met = _judged(_results(floor_p99=80.0, apply_share=0.995, first_cpu=8.0))
    assert met["dispatch p99 at 10 jobs/s during churn, against the floor's"] is True
    assert met["dispatch p99 at 50 jobs/s during churn, against the floor's"] is True
    assert met["a Pod event to its room counted, p99 while placements run"] is True
    assert met["placement CPU p99, a 32-pod job at 1000 Nodes"] is True
    assert met["the first job of a shape against the rest's p99, placement CPU"] is True
    missed = _judged(_results(floor_p99=79.0, apply_share=0.98, first_cpu=8.1))
    assert missed["dispatch p99 at 50 jobs/s during churn, against the floor's"] is False
    assert missed["a Pod event to its room counted, p99 while placements run"] is False
    assert missed["the first job of a shape against the rest's p99, placement CPU"] is False


def test_the_table_sets_the_floor_beside_the_dispatcher():
    results = _results(floor_p99=80.0, apply_share=0.995, first_cpu=8.0)
    for step, under in zip(results["steady_churn"], results["floor"], strict=True):
        step.update(seconds=20, jobs=200, dispatched=200, missing=0,
                    writes={"patch": {"p50_ms": 5.0, "p99_ms": 50.0}})
        under.update(jobs=200, dispatched=200, missing=0, failed=0)
    results["budgets"] = scale.budgets(results)
    table = scale_report.render(results)
    assert "| 50 jobs/s | 200/200 / 200/200 | 20 / 100 | 10 / 80 | 2 / 1.25 " \
           "| 5 / 50, n/a / n/a |" in table, table
    assert "| 1.25 x the floor | <= 1.25 x the floor | met |" in table, table
