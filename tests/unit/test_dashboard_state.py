"""The dashboard's JSON, built from cached objects, and its routes on the metrics
server (no API server, no browser)."""

from __future__ import annotations

import http.client
import json
import time
from decimal import Decimal

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from controller_kit.observability import ObservabilityServer
from dispatcher import dashboard
from dispatcher.config import DispatcherConfig
from dispatcher.controller import DispatcherController
from dispatcher.dashboard import build_state, display_amount
from dispatcher.job_state import job_state
from dispatcher.placement.waiting_line import Waiting
from dispatcher.remote_view.job_life import JobLife, last_bytes
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c


def _job(name: str, namespace: str = "team-a", *, worker: str | None = None,
         conditions: list[dict] | None = None, jobs_status: list[dict] | None = None,
         managed_by: str = c.MANAGED_BY_MULTIKUEUE) -> dict:
    annotations = {c.PLACEMENT_ANNOTATION: worker} if worker else {}
    return {"metadata": {"namespace": namespace, "name": name, "annotations": annotations,
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"managedBy": managed_by},
            "status": {"conditions": conditions or [], "jobsStatus": jobs_status or []}}


def _worker(name: str, order: int, *, active: bool, cpu: str, used_cpu: str = "") -> WorkerCluster:
    worker = WorkerCluster(name=name, order=order, fingerprint=name)
    worker.active, worker.reason = active, "Active" if active else "ClientConnectionFailed"
    worker.message = "connected" if active else "cannot reach it"
    worker.capacity.on_node("ADDED", None, {
        "metadata": {"name": f"{name}-node"},
        "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    if used_cpu:
        worker.capacity.on_pod("ADDED", None, {
            "metadata": {"namespace": "team-a", "name": "p"},
            "spec": {"nodeName": f"{name}-node",
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": used_cpu}}}]},
            "status": {"phase": "Running"}})
    return worker


JOBS = [
    _job("waiting", conditions=[{"type": "Placed", "status": "False", "reason": "NoWorkerFits",
                                 "message": "worker-1: needs 64 cpu, 12 free"}]),
    _job("running", worker="worker-1",
         jobs_status=[{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0}]),
    _job("done", "team-b", worker="worker-2",
         conditions=[{"type": "Complete", "status": "True", "reason": "AllJobsCompleted"}]),
    _job("broken", "team-b", worker="worker-1",
         conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                      "message": "node failed 3 times"}]),
    _job("not-ours", managed_by="kubeflow.org/training-operator"),
]


def _state():
    lags = {("team-a", "running"): (0.25, None), ("team-b", "broken"): (0.5, 3.0)}
    workers = [_worker("worker-1", 0, active=True, cpu="16", used_cpu="4"),
               _worker("worker-2", 1, active=False, cpu="64")]
    return build_state(JOBS, workers, (True, "leader"), "multikueue",
                       lambda ns, name: lags.get((ns, name), (None, None)))


def test_jobs_carry_the_status_commands_state_split_into_state_and_reason():
    jobs = {j["name"]: j for j in _state()["trainJobs"]}
    assert set(jobs) == {"waiting", "running", "done", "broken"}  # only multicluster jobs
    assert job_state(JOBS[0]) == "Pending (NoWorkerFits)"
    assert (jobs["waiting"]["state"], jobs["waiting"]["reason"]) == ("Pending", "NoWorkerFits")
    assert jobs["waiting"]["message"] == "worker-1: needs 64 cpu, 12 free"
    assert jobs["waiting"]["worker"] == ""
    assert (jobs["running"]["state"], jobs["running"]["worker"]) == ("Running", "worker-1")
    assert jobs["running"]["jobsStatus"][0]["active"] == 2
    assert jobs["running"]["syncLagSeconds"] == 0.25
    assert jobs["running"]["syncWaitingSeconds"] is None
    assert (jobs["done"]["state"], jobs["done"]["reason"], jobs["done"]["message"]) == (
        "Complete", "", "")
    assert (jobs["broken"]["state"], jobs["broken"]["message"]) == ("Failed", "node failed 3 times")
    assert jobs["broken"]["syncWaitingSeconds"] == 3.0
    assert jobs["broken"]["conditions"][0]["reason"] == "BackoffLimitExceeded"


def test_jobs_sorted_and_counted_by_state():
    state = _state()
    assert [(j["namespace"], j["name"]) for j in state["trainJobs"]] == [
        ("team-a", "running"), ("team-a", "waiting"), ("team-b", "broken"), ("team-b", "done")]
    assert state["counts"] == {"Complete": 1, "Failed": 1, "Pending": 1, "Running": 1}
    assert (state["ready"], state["role"], state["origin"]) == (True, "leader", "multikueue")


def test_clusters_carry_state_jobs_placed_and_capacity():
    clusters = {x["name"]: x for x in _state()["clusters"]}
    one, two = clusters["worker-1"], clusters["worker-2"]
    assert (one["active"], one["reason"], one["jobs"]) == (True, "Active", 2)
    assert (two["active"], two["reason"], two["jobs"]) == (False, "ClientConnectionFailed", 1)
    cpu = next(r for r in one["capacity"] if r["resource"] == "cpu")
    assert (cpu["allocatable"], cpu["used"], cpu["free"]) == ("16", "4", "12")
    assert cpu["takenFraction"] == 0.25
    memory = next(r for r in one["capacity"] if r["resource"] == "memory")
    assert memory["display"]["allocatable"] == "64Gi"
    assert (one["nodes"], one["usableNodes"]) == (1, 1)


def test_the_waiting_line_is_shown_in_order_with_each_jobs_position_and_priority():
    line = [Waiting(1, ("team-a", "waiting"), 1000, "high", ("worker-1",)),
            Waiting(2, ("team-c", "gone-meanwhile"), 0, "", ())]
    state = build_state(JOBS, [], (True, "leader"), "multikueue", waiting=line)
    assert state["waitingLine"] == [
        {"position": 1, "namespace": "team-a", "name": "waiting", "priority": 1000,
         "priorityClass": "high", "candidates": ["worker-1"]},
        {"position": 2, "namespace": "team-c", "name": "gone-meanwhile", "priority": 0,
         "priorityClass": "", "candidates": []}]
    jobs = {j["name"]: j for j in state["trainJobs"]}
    assert (jobs["waiting"]["waitingPosition"], jobs["waiting"]["priority"]) == (1, 1000)
    assert (jobs["running"]["waitingPosition"], jobs["running"]["priority"]) == (None, None)
    assert _state()["waitingLine"] == []


def test_state_is_plain_json():
    state = _state()
    assert json.loads(json.dumps(state)) == state


def test_amounts_for_people():
    assert display_amount("cpu", Decimal("15.9")) == "15.9"
    assert display_amount("cpu", Decimal("0.1")) == "0.1"
    assert display_amount("memory", Decimal(512 * 2 ** 30)) == "512Gi"
    assert display_amount("memory", Decimal(3 * 2 ** 29)) == "1.5Gi"
    assert display_amount("memory", Decimal(100)) == "100"
    assert display_amount("nvidia.com/gpu", Decimal(8)) == "8"


def _get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_page_and_state_served_next_to_metrics():
    # A controller that was never started: nothing synced, and no API request is made.
    controller = DispatcherController(client.ApiClient(), DispatcherConfig())
    routes = dashboard.routes(controller)

    def broken(_query):
        raise KeyError("no such thing")

    server = ObservabilityServer(0, CollectorRegistry(), controller.ready,
                                 routes={**routes, "/broken": broken}).start()
    try:
        code, headers, body = _get(server.port, "/")
        assert code == 200 and headers["Content-Type"].startswith("text/html")
        assert body == (dashboard.PAGE_DIR / "index.html").read_bytes()
        assert headers["Content-Security-Policy"] == "default-src 'self'"
        for path in ("/app.js", "/style.css"):
            assert _get(server.port, path)[0] == 200, path
        # Nothing on the page comes from another host.
        for name in ("index.html", "app.js", "style.css"):
            assert "http" not in (dashboard.PAGE_DIR / name).read_text(), name
        code, headers, body = _get(server.port, "/api/state?state=Running")
        state = json.loads(body)
        assert (code, state["ready"], state["role"]) == (
            200, False, "manager TrainJob cache not synced")
        assert (state["clusters"], state["trainJobs"]) == ([], [])
        assert _get(server.port, "/metrics")[0] == 200
        code, _, body = _get(server.port, "/broken")
        assert code == 500 and b"/broken" in body and b"no such thing" in body
        code, _, body = _get(server.port, "/nothing-here")
        assert code == 404 and b"/nothing-here" in body
    finally:
        server.stop()


def test_built_in_paths_cannot_be_replaced():
    with pytest.raises(ValueError, match="/metrics"):
        ObservabilityServer(0, CollectorRegistry(), lambda: (True, "ok"),
                            routes={"/metrics": lambda _q: (200, "text/plain", b"")})


# --- a job's life on its worker: what is decided before any worker is asked -------------

def _life(*jobs: dict, workers: tuple[WorkerCluster, ...] = (), **bounds) -> tuple:
    by_key = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in jobs}
    life = JobLife(lambda ns, name: by_key.get((ns, name)), lambda: list(by_key.values()),
                   lambda: list(workers), **bounds)
    return dashboard.job_routes(lambda ns, name: by_key.get((ns, name)), life), life


def _answer(route, **params: str | list[str]) -> tuple[int, dict]:
    code, content_type, body = route({k: v if isinstance(v, list) else [v]
                                      for k, v in params.items()})
    assert content_type == "application/json"
    return code, json.loads(body)


def test_job_routes_refuse_bad_parameters_naming_them():
    routes, _ = _life(_job("a", worker="worker-1"))
    job, log = routes[dashboard.JOB_PATH], routes[dashboard.LOG_PATH]
    for route, params, says in [
            (job, {}, "namespace: required"),
            (job, {"namespace": "team-a", "name": ["a", "b"]}, "name: given 2 times"),
            (job, {"namespace": "team-a", "name": "A_B"}, "name='A_B': not a valid name"),
            (log, {"namespace": "team-a", "name": "a", "pod": "p", "tailLines": "0"},
             "tailLines=0: must be from 1 to 1000"),
            (log, {"namespace": "team-a", "name": "a", "pod": "p", "follow": "true"},
             "follow: not a parameter of /api/job/log")]:
        code, body = _answer(route, **params)
        assert (code, body["kind"], body["reason"]) == (400, "Status", "BadRequest"), body
        assert says in body["message"], (params, body)


def test_a_job_not_dispatched_or_on_an_unreachable_worker_says_so():
    down = _worker("worker-1", 0, active=False, cpu="8")
    routes, _ = _life(_job("a", worker="worker-1"), _job("mine", managed_by="kubeflow.org/x"),
                      workers=(down,))
    code, body = _answer(routes[dashboard.JOB_PATH], namespace="team-a", name="mine")
    assert code == 404 and "not a multicluster TrainJob" in body["message"], body
    # Not connected: said at once, naming the worker, without asking it anything.
    code, body = _answer(routes[dashboard.LOG_PATH], namespace="team-a", name="a", pod="a-x")
    assert code == 503 and "its worker worker-1 is not connected to the dispatcher" in \
        body["message"], body


def test_log_reads_beyond_the_bound_get_429():
    routes, life = _life(_job("a", worker="worker-1"), max_log_reads=1)
    assert life._log_reads.acquire(blocking=False)  # one read under way
    try:
        code, body = _answer(routes[dashboard.LOG_PATH], namespace="team-a", name="a",
                             pod="a-x")
    finally:
        life._log_reads.release()
    assert (code, body["reason"]) == (429, "TooManyRequests"), body
    assert "1 logs are being read for the dashboard already" in body["message"], body


class _Chunks:
    def __init__(self, *chunks: bytes):
        self.chunks = list(chunks)

    def read1(self, _size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_a_log_keeps_its_end_from_a_line_start():
    text, cut = last_bytes(_Chunks(b"one\ntwo\n", b"three\n"), 100, time.monotonic() + 5)
    assert (text, cut) == ("one\ntwo\nthree\n", False)
    text, cut = last_bytes(_Chunks(b"one\ntwo\n", b"three\n"), 8, time.monotonic() + 5)
    assert (text, cut) == ("three\n", True)
    # Past the deadline: what came so far, said to be cut.
    assert last_bytes(_Chunks(b"x\n"), 100, time.monotonic() - 1) == ("", True)
