"""The benchmark's pure figure code: what admission webhooks cost between two metric
snapshots, and how the constrained-placement target is judged when Kueue's run strands
jobs."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest

from bench import apicost, cli
from bench.report import targets

HOOK = "mworkload.kb.io"


def test_webhook_cost_is_the_difference_per_job_and_names_the_slowest():
    before = Counter({(HOOK, "CREATE", "calls"): 10, (HOOK, "CREATE", "ms"): 500})
    after = Counter({(HOOK, "CREATE", "calls"): 30, (HOOK, "CREATE", "ms"): 2500,
                     ("vjobset.kb.io", "CREATE", "calls"): 10,
                     ("vjobset.kb.io", "CREATE", "ms"): 100})
    cost = apicost.webhook_cost(before, after, jobs=10)
    assert cost["calls_per_job"] == 3.0
    assert cost["ms_per_job"] == 210.0
    assert cost["mean_ms_per_call"] == 70.0
    assert cost["slowest"][0] == {"webhook": f"{HOOK} CREATE", "ms": 2000}


def test_webhook_cost_without_calls_has_no_mean():
    cost = apicost.webhook_cost(Counter(), Counter(), jobs=5)
    assert (cost["calls_per_job"], cost["ms_per_job"], cost["mean_ms_per_call"]) == (0, 0, None)


def _results(span_a, span_c, stuck_c=0, timeout=150.0) -> dict:
    def constrained(span, stuck):
        return {"makespan_seconds": span, "pods_unschedulable": stuck}
    return {"settings": {"constrained_timeout": timeout},
            "comparison": {"contenders": {"A": {"constrained": constrained(span_a, 6)},
                                          "C": {"constrained": constrained(span_c, stuck_c)}}}}


def _makespan_row(results: dict) -> dict:
    return next(row for row in targets(results) if row["target"].startswith("C's constrained"))


@pytest.mark.parametrize("span_a, span_c, stuck_c, met", [
    (100.0, 80.0, 0, True),      # C at 0.8x A
    (100.0, 81.0, 0, False),     # just over
    (100.0, 50.0, 2, False),     # fast, but pods were stuck
    (None, 100.0, 0, True),      # A stranded jobs: its makespan exceeds the 150 s timeout
    (None, 130.0, 0, False),     # ... which only proves C <= 0.8x A up to 120 s
    (None, None, 0, False),      # C did not finish either
])
def test_constrained_target_judged_against_the_timeout_when_a_never_finishes(
        span_a, span_c, stuck_c, met):
    row = _makespan_row(_results(span_a, span_c, stuck_c))
    assert row["met"] is met, row
    if span_a is None:
        assert "A not finished in 150 s" in row["measured"], row


def test_a_sigterm_mid_run_writes_what_was_measured_marked_incomplete(tmp_path, monkeypatch):
    def measure_then_get_terminated(settings, output, state_dir, mode, results):
        results["ceiling"] = {"limit_creates_per_second": 120.0}
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "run_benchmark", measure_then_get_terminated)
    try:
        status = cli.main(["--quick", "--output", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    written = json.loads((tmp_path / "results.json").read_text())
    assert status == 128 + signal.SIGTERM
    assert written == {"ceiling": {"limit_creates_per_second": 120.0},
                       "incomplete": "terminated (SIGTERM)"}, written


def _step(rate, p99, **extra) -> dict:
    return {"rate": rate, "latency": {"p99_ms": p99}, **extra}


def _row(results: dict, start: str) -> dict:
    return next(row for row in targets(results) if row["target"].startswith(start))


def _api(manager: float, **workers: float) -> dict:
    return {"per_job": {"manager_writes_all": manager},
            "writes_per_job_by_apiserver": {"manager": manager, **workers}}


def test_d_is_judged_at_its_own_client_limits_when_its_scenarios_ran():
    """The comparison holds D to Kueue's 5 qps per worker; the write-bound and p99 targets
    take D at its own limits from the same run's scenarios when there are any."""
    ceiling = {"manager": {"creates_per_second": 100.0},
               "worker-1": {"creates_per_second": 90.0}}
    comparison = {"ceiling": ceiling, "contenders": {
        "D": {"burst": {"jobs": 10, "throughput_jobs_per_second": 3.0,
                        "api": _api(3.0, **{"worker-1": 9.0, "worker-2": 6.0})},
              "steady": [_step(50, 9000.0)]},
        "C": {"steady": [_step(50, 40000.0,
                               nomination_from_quota_reserved={"p99_ms": 80.0},
                               latency_from_quota_reserved={"p99_ms": 30000.0})]}}}
    alone = {"settings": {"constrained_timeout": 150.0}, "comparison": comparison}
    bound = _row(alone, "D's burst throughput >= 50% of the apiservers' write bound")
    # The busiest apiserver decides: worker-1, 90 creates/s over 9 writes per job.
    assert bound["met"] is False, bound
    assert "3.0 jobs/s = 30.0% of 10.0 jobs/s (worker-1: 90.0 creates/s / 9.0 writes" \
        in bound["measured"] and "Kueue's client limits" in bound["measured"], bound
    assert _row(alone, "dispatch p99")["met"] is False  # D 9 s at 5 qps per worker

    full = {**alone, "ceiling": {**ceiling, "limit_creates_per_second": 90.0},
            "burst": {"jobs": 10, "throughput_jobs_per_second": 20.0,
                      "api": _api(2.0, **{"worker-1": 1.0, "worker-2": 1.0})},
            "steady": [_step(50, 90.0)]}
    bound = _row(full, "D's burst throughput >= 50% of the apiservers' write bound")
    # The manager's writes include the user's create: 100 / (2 + 1).
    assert bound["met"] is True and "20.0 jobs/s = 60.0% of 33.3 jobs/s (manager" \
        in bound["measured"], bound
    p99 = _row(full, "dispatch p99")
    # C's dispatch is its nomination; Kueue's copy after it is shown beside.
    assert p99["met"] is True, p99
    assert "C 80.0 ms from quota reservation to nomination" in p99["measured"], p99
    assert "30000.0 ms" in p99["measured"], p99


@pytest.mark.parametrize("drain, shown", [
    ({"seconds": 12.5, "complete": True}, "12.5"),
    ({"seconds": 90.0, "complete": False,
      "left": {"manager workloads": 700, "worker-1 trainjobs": 20}, "forced_seconds": 14.2},
     "not within 90.0 (720 objects left; cleared by force in 14.2 s)"),
    # A run stopped while clearing: what was left, without a forced time.
    ({"seconds": 90.0, "complete": False, "left": {"manager trainjobs": 3}},
     "not within 90.0 (3 objects left)"),
])
def test_a_step_drain_says_what_was_left_and_whether_it_was_cleared_by_force(drain, shown):
    from bench.report import _drained

    assert _drained(drain) == shown


def _pod(name: str, job: str, phase: str, namespace: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": namespace,
                         "labels": {"jobset.sigs.k8s.io/jobset-name": job}},
            "status": {"phase": phase}}


def test_a_job_runs_when_each_of_its_pods_has_run_on_one_worker():
    """Pods of kwok's end seconds after they start: a pod counts from the first event that
    shows it running or ended; pending pods and deletions count for nothing; the earliest
    worker where all of a job's pods ran gives its time."""
    from bench.timeline import Timelines

    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                  "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                  "users": [{"name": "u", "user": {"token": "t"}}]}
    timelines = Timelines({"manager": kubeconfig, "w1": kubeconfig, "w2": kubeconfig},
                          pods_per_job=3)
    w1, w2 = timelines.pods["w1"], timelines.pods["w2"]
    w1._record("ADDED", _pod("a-init-1", "a", "Pending"), 1.0)
    w1._record("MODIFIED", _pod("a-init-1", "a", "Running"), 2.0)
    w1._record("MODIFIED", _pod("a-init-1", "a", "Succeeded"), 5.0)  # the same pod again
    w1._record("MODIFIED", _pod("a-init-2", "a", "Running"), 3.0)
    w1._record("DELETED", _pod("a-node-0", "a", "Running"), 4.0)
    assert timelines.running(("ns", "a")) is None
    w1._record("MODIFIED", _pod("a-node-0", "a", "Succeeded"), 6.0)  # seen only ended
    w2._record("MODIFIED", _pod("a-node-0", "a", "Running"), 1.5)  # another copy, 1 of 3
    assert timelines.running(("ns", "a")) == 6.0
    w2._record("MODIFIED", _pod("a-init-1", "a", "Running"), 1.6)
    w2._record("MODIFIED", _pod("a-init-2", "a", "Running"), 1.7)
    assert timelines.running(("ns", "a")) == 1.7
    timelines.forget("ns")
    assert timelines.running(("ns", "a")) is None
    timelines.stop()


def test_a_repeated_step_reports_percentiles_over_all_its_samples_and_each_repeats_spread():
    from bench.repeats import percentiles

    runs = [{"samples": [0.010] * 98 + [0.050] * 2}, {"samples": [0.012] * 98 + [0.400] * 2},
            {"samples": [0.011] * 98 + [0.070] * 2}]
    merged = percentiles(runs, "samples")
    # 300 samples: the p99 is the third largest of all, where each repeat's is its second.
    assert merged["count"] == 300 and merged["repeats"] == 3
    assert merged["p99_ms"] == 70.0 and merged["max_ms"] == 400.0
    assert merged["p50_ms"] == 11.0
    # One repeat's stall (400 ms) shows in the spread of the repeats' own figures.
    assert merged["spread"]["p99_ms"] == {"min": 50.0, "median": 70.0, "max": 400.0}
    # A repeat that saw nothing (every copy missing) does not count as a zero.
    empty = percentiles([{"samples": []}, {"samples": [0.020]}], "samples")
    assert empty["p99_ms"] == 20.0
    assert empty["spread"]["p99_ms"] == {"min": 20.0, "median": 20.0, "max": 20.0}
    # A step run once is its own figures, without a spread.
    assert "spread" not in percentiles(runs[:1], "samples")


def test_cpu_of_several_windows_adds_up_and_weighs_the_busy_share_by_length():
    from bench.footprint import cpu_sum

    merged = cpu_sum([
        {"cpu_seconds": {"dispatcher": 1.0, "manager apiserver+etcd": 4.0},
         "host_busy_share": 0.5, "host_cpu_seconds_available": 20.0},
        {"cpu_seconds": {"dispatcher": 0.5, "manager apiserver+etcd": 1.0},
         "host_busy_share": 1.0, "host_cpu_seconds_available": 5.0}])
    assert merged == {"cpu_seconds": {"dispatcher": 1.5, "manager apiserver+etcd": 5.0},
                      "host_cpu_seconds_available": 25.0, "host_busy_share": 0.6}


def test_the_dispatchers_log_gives_each_jobs_steps_for_its_namespace_only(tmp_path):
    from bench import dispatch_log

    log_file = tmp_path / "dispatcher.log"
    log_file.write_text(
        "2026-11-27 05:00:00,001 INFO dispatcher.standalone.reconciler: TrainJob ns-a/j1 "
        "placed on worker-2, copy created (queued 0.21 ms; decide 0.05, place 0.41, "
        "patch 4.12, create 5.03 ms) namespace=ns-a name=j1 cluster=worker-2\n"
        "2026-11-27 05:00:00,002 INFO dispatcher.standalone.reconciler: TrainJob ns-b/j1 "
        "placed on worker-1, copy created (decide 0.05, place 0.41, patch 1.00, "
        "create 2.00 ms) namespace=ns-b name=j1 cluster=worker-1\n"
        "2026-11-27 05:00:00,003 INFO controller_kit.service: something else\n"
        # After a crash between a create and its answer, the copy is adopted.
        "2026-11-27 05:00:00,004 INFO dispatcher.standalone.reconciler: TrainJob ns-a/j2 "
        "placed on worker-1, copy adopted (queued 1.00 ms; decide 0.05, place 0.41, "
        "patch 1.00, create 2.00 ms) namespace=ns-a name=j2 cluster=worker-1\n")
    assert dispatch_log.read(log_file, "ns-a") == {
        ("ns-a", "j1"): pytest.approx({"queue": 0.00021, "decide": 0.00005, "place": 0.00041,
                                       "patch": 0.00412, "create": 0.00503}),
        ("ns-a", "j2"): pytest.approx({"queue": 0.001, "decide": 0.00005, "place": 0.00041,
                                       "patch": 0.001, "create": 0.002})}
    assert dispatch_log.read(log_file, "ns-b")[("ns-b", "j1")]["patch"] == 0.001
    assert dispatch_log.read(log_file, "ns-c") == {}


def test_the_slowest_dispatches_split_into_queue_steps_writes_and_the_rest():
    from bench import dispatch_log

    steps = {("ns", f"j{i}"): {"queue": 0.001, "decide": 0.001, "place": 0.001,
                               "patch": 0.005, "create": 0.005} for i in range(200)}
    latencies = dict.fromkeys(steps, 0.015)
    # The two slowest (1% of 200): their PATCH waited long.
    for name, latency in (("j7", 0.1), ("j9", 0.08)):
        latencies[("ns", name)] = latency
        steps[("ns", name)] = {**steps[("ns", name)], "patch": latency - 0.020}
    latencies[("ns", "no-log")] = 1.0  # a job without a logged line is left out
    slowest = dispatch_log.slowest(latencies, steps)
    assert slowest["jobs"] == 2 and slowest["of"] == 200, slowest
    assert slowest["latency_ms"] == 90.0
    assert slowest["mean_ms"] == {"queue": 1.0, "decide": 1.0, "place": 1.0,
                                  "patch": 70.0, "create": 5.0, "outside": 12.0}
    assert slowest["shares"] == {"queue": 0.011, "dispatcher steps": 0.022,
                                 "writes": 0.833, "the rest": 0.133}
    assert dispatch_log.slowest(latencies, {}) is None
    # A tail of 1 % rounds up: 250 jobs give 3.
    many = {("ns", f"k{i}"): 0.01 * i for i in range(250)}
    assert dispatch_log.slowest(many, {k: {"patch": 0.001} for k in many})["jobs"] == 3


def test_the_rest_of_a_slow_dispatch_may_be_negative_and_the_row_says_so():
    """The create step ends when the dispatcher has read the answer, which may be after
    the benchmark's watch saw the copy: the parts overlap, and the rest is negative."""
    from bench import dispatch_log
    from bench.report import _slowest_rows

    key = ("ns", "j")
    slowest = dispatch_log.slowest({key: 0.010}, {key: {"queue": 0.001, "patch": 0.004,
                                                        "create": 0.006}})
    assert slowest["mean_ms"]["outside"] == pytest.approx(-1.0)
    assert slowest["shares"]["the rest"] == -0.1
    row = _slowest_rows(slowest)[0]
    assert "| 10.0 = 1.0 + 4.0 + 6.0 - 1.0 (queue 10%, " in row, row
    assert _slowest_rows(None) == []


def test_cpu_of_several_windows_weighs_the_stolen_share_like_the_busy_share():
    from bench.footprint import cpu_sum

    merged = cpu_sum([
        {"cpu_seconds": {}, "host_busy_share": 0.5, "host_cpu_seconds_available": 30.0,
         "host_steal_share": 0.1},
        {"cpu_seconds": {}, "host_busy_share": 0.5, "host_cpu_seconds_available": 10.0,
         "host_steal_share": 0.0}])
    assert merged["host_steal_share"] == 0.075, merged


def test_the_host_speed_is_cpu_time_of_fixed_work_and_the_table_shows_it(monkeypatch):
    """The reference work does the same thing every time (same checksum), its figure is
    CPU time (a thread waiting for the CPU does not count), and the table prints both
    readings, or only the start's when the run ended early."""
    import threading

    from bench import host_speed
    from bench.report import _host_speed_line

    assert host_speed.reference_work(50) == host_speed.reference_work(50) > 0
    # A thread that waits costs no CPU time: a figure from thread CPU time, not wall time.
    calls = []
    monkeypatch.setattr(host_speed, "reference_work",
                        lambda rounds=0: calls.append(threading.Event().wait(0.05)))
    assert host_speed.reference_ms(repeats=3) < 20, "waiting counted as work"
    assert len(calls) == 3
    assert _host_speed_line({"reference_work_ms": {"start": 25.1, "end": 31.0}}) == [
        "Host speed: the reference work took 25.1 ms of CPU at the start, 31.0 ms at the "
        "end (lower is faster; compare runs by it)"]
    assert "at the end" not in _host_speed_line({"reference_work_ms": {"start": 25.1}})[0]
    assert _host_speed_line({}) == []


def test_copies_count_the_workers_creates_and_deletes_of_trainjobs_and_workloads():
    """Copies are what the workers' apiservers created and deleted; the manager's own
    Workloads and a status write are not copies."""
    from bench.report import copies, writes_by_apiserver

    def served(resource, verb, count, subresource=""):
        return {"resource": resource, "subresource": subresource, "verb": verb,
                "count": count}

    trainjobs, workloads = "trainjobs.trainer.kubeflow.org", "workloads.kueue.x-k8s.io"
    burst = {"jobs": 4, "workers": 2, "api": {"per_job": {}, "requests": {
        "manager": [served(workloads, "POST", 4), served(trainjobs, "POST", 4)],
        "worker-1": [served(workloads, "POST", 4), served(trainjobs, "POST", 3),
                     served(workloads, "DELETE", 1), served(workloads, "PUT", 5, "status")],
        "worker-2": [served(workloads, "POST", 4), served(trainjobs, "POST", 1),
                     served(workloads, "DELETE", 3)]}}}
    assert copies(burst) == {"TrainJob created": 1.0, "TrainJob deleted": 0.0,
                             "Workload created": 2.0, "Workload deleted": 1.0}
    # Without the recorded figure, per apiserver from the same tables, the user's creates
    # left out on the manager.
    assert writes_by_apiserver(burst) == {"manager": 1.0, "worker-1": 3.25, "worker-2": 2.0}


def test_dry_run_creates_are_neither_copies_nor_writes_but_counted_apart():
    """Kueue's Workload dry-run creates are admitted but not stored: they count as dry runs
    per job, not as Workloads created on the workers nor as any apiserver's writes."""
    from bench.apicost import DRY_RUN
    from bench.report import copies, dry_runs, writes_by_apiserver

    workloads = "workloads.kueue.x-k8s.io"
    burst = {"jobs": 2, "workers": 1, "api": {"per_job": {}, "requests": {
        "manager": [{"resource": workloads, "subresource": "", "verb": "POST" + DRY_RUN,
                     "count": 6},
                    {"resource": "trainjobs.trainer.kubeflow.org", "subresource": "",
                     "verb": "POST", "count": 2}],
        "worker-1": [{"resource": workloads, "subresource": "", "verb": "POST", "count": 2},
                     {"resource": workloads, "subresource": "", "verb": "POST" + DRY_RUN,
                      "count": 10}]}}}
    assert copies(burst)["Workload created"] == 1.0
    assert dry_runs(burst) == {"manager": 3.0, "workers": 5.0}
    # The manager's only writes are the user's creates, which are left out.
    assert writes_by_apiserver(burst) == {"manager": 0.0, "worker-1": 1.0}


def test_sync_log_splits_a_change_by_the_first_copy_logged_after_its_write(tmp_path):
    from bench import sync_log
    log_file = tmp_path / "dispatcher.log"
    log_file.write_text(
        "x INFO dispatcher.standalone.reconciler: TrainJob ns-a/j1 status copied from w-1 "
        "(seen at 100.010000; queued 1.00 ms; decide 0.50, write 4.00 ms; cpu decide 0.40, "
        "write 0.30 ms)\n"
        "x INFO dispatcher.standalone.reconciler: TrainJob ns-a/j1 status copied from w-1 "
        "(seen at 200.020000; queued 2.00 ms; decide 0.50, write 4.00 ms; cpu decide 0.40, "
        "write 0.30 ms)\n"
        "x INFO dispatcher.standalone.reconciler: TrainJob ns-b/j1 status copied from w-1 "
        "(seen at 100.000000; decide 0.50, write 4.00 ms; cpu decide 0.40, write 0.30 ms)\n")
    logged = sync_log.read(log_file, {"ns-a"})
    assert list(logged) == [("ns-a", "j1")]
    # The second repeat's write at 200.0 is matched with the line seen after it.
    parts = sync_log.segments(200.0, 200.050, logged[("ns-a", "j1")])
    assert parts["to dispatcher"] == pytest.approx(0.020)
    assert parts["queue"] == pytest.approx(0.002)
    assert parts["to benchmark"] == pytest.approx(0.050 - 0.020 - 0.002 - 0.0005 - 0.004)
    assert sync_log.segments(300.0, 300.1, logged[("ns-a", "j1")]) is None
    slowest = sync_log.slowest([(0.050, parts), (0.010, {**parts, "queue": 0.0})], share=0.5)
    assert (slowest["changes"], slowest["of"], slowest["lag_ms"]) == (1, 2, 50.0)
    assert slowest["largest"] == "to benchmark", slowest
    assert sync_log.slowest([]) is None
