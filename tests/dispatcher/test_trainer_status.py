"""Trainer progress reaches the manager: the worker's operator serves the trainer status
endpoint (``--enable-trainer-status``), a pod-like client reports progress on the worker
copy, and the dispatcher copies ``status.trainerStatus`` onto the manager TrainJob with the
rest of the status.

The copy's pods run no containers (kwok), and the shared runtime's pods have no service
account name to bind a token to, so the client uses a TokenRequest for a service account of
the job's namespace with the job's audience: the audience and namespace are what the
endpoint checks (binding to a pod is exercised in tests/operator/test_trainer_status.py).
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl

import pytest
from kubernetes import client

from clusters.controlplane import free_port
from clusters.testing import ServiceProcess, eventually
from dispatch_helpers import create, get, trainjob, wait_placed
from trainjob import trainer_status as ts

PROGRESS = {"progressPercentage": 55, "estimatedRemainingSeconds": 120,
            "metrics": [{"name": "loss", "value": "0.42"}],
            "lastUpdatedTime": "2025-06-01T12:00:00Z"}


@pytest.fixture(scope="module")
def reporting_workers(dispatch_env, tmp_path_factory):
    """Both workers' operators restarted with the endpoint on; the plain ones come back
    afterwards for the rest of the module's tests."""
    directory = tmp_path_factory.mktemp("trainer-status")
    ports = {}
    for name in ("worker-1", "worker-2"):
        cert_dir = directory / name
        ca = dispatch_env.multicluster.harness.issue_serving_certificate(name, cert_dir)
        shutil.copyfile(ca, cert_dir / "ca.crt")
        ports[name] = free_port()
        dispatch_env.operators[name].stop()
        dispatch_env.operators[name] = ServiceProcess(
            "training_operator", dispatch_env.multicluster[name].kubeconfig,
            directory / f"operator-{name}.log",
            ("--webhook-cert-dir", str(cert_dir), "--webhook-port", str(free_port()),
             "--enable-trainer-status", "--trainer-status-port", str(ports[name]))).start()
    yield {name: (port, directory / name / "ca.crt") for name, port in ports.items()}
    for name in ports:
        dispatch_env.operators[name].stop()
        dispatch_env.operators[name] = ServiceProcess(
            "training_operator", dispatch_env.multicluster[name].kubeconfig,
            directory / f"operator-{name}-plain.log", ()).start()


def post(port: int, ca, path: str, body: dict, token: str) -> tuple[int, dict]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                       context=ssl.create_default_context(cafile=str(ca)))
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Authorization": f"Bearer {token}",
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def test_the_manager_shows_the_trainers_progress(dispatch_env, reporting_workers, namespace):
    create(dispatch_env.manager, namespace, trainjob("progress"))
    worker_name, _ = wait_placed(dispatch_env, namespace, "progress")
    worker = dispatch_env.multicluster[worker_name]
    # The copy's JobSet carries the wiring: the operator there has the endpoint on.
    jobset = eventually(lambda: get(worker, namespace, "progress", "jobsets",
                                    ("jobset.x-k8s.io", "v1alpha2")),
                        lambda found: found is not None, expected="the copy's JobSet")
    assert ts.VOLUME_NAME in json.dumps(jobset["spec"])

    core = client.CoreV1Api(worker.api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reporter")))
    token = core.create_namespaced_service_account_token(
        "reporter", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[ts.token_audience(namespace, "progress")]))).status.token
    port, ca = reporting_workers[worker_name]
    code, answer = post(port, ca, ts.status_path(namespace, "progress"),
                        {"trainerStatus": PROGRESS}, token)
    assert code == 200, answer

    manager = eventually(lambda: get(dispatch_env.manager, namespace, "progress"),
                         lambda job: (job.get("status") or {}).get("trainerStatus") == PROGRESS,
                         expected="the manager TrainJob showing the worker's trainerStatus")
    assert any(x["type"] == "Created" for x in manager["status"]["conditions"])

    # A later report replaces it on the manager too.
    later = {"progressPercentage": 80, "lastUpdatedTime": "2025-06-01T12:10:00Z"}
    assert post(port, ca, ts.status_path(namespace, "progress"),
                {"trainerStatus": later}, token)[0] == 200
    eventually(lambda: get(dispatch_env.manager, namespace, "progress"),
               lambda job: (job.get("status") or {}).get("trainerStatus") == later,
               expected="the manager TrainJob showing the later report")
