"""Trainer progress reaches the manager: ``status.trainerStatus`` written on the worker copy
(as the operator's trainer status endpoint writes it: a server-side apply of that field
alone through the status subresource, field manager ``trainer-status``) shows on the manager
TrainJob with the rest of the status, and a later report replaces it there.

The endpoint itself (tokens, refusals, the JobSet wiring) is tested against real API
servers in tests/operator/test_trainer_status.py; here it is the dispatcher's copy back."""

from __future__ import annotations

import json

from clusters.testing import eventually
from trainjob import constants as c
from trainjob import trainer_status as ts

from dispatch_helpers import TRAINER, create, get, trainjob, wait_placed

PROGRESS = {"progressPercentage": 55, "estimatedRemainingSeconds": 120,
            "metrics": [{"name": "loss", "value": "0.42"}],
            "lastUpdatedTime": "2025-06-01T12:00:00Z"}


def report(worker, namespace: str, name: str, progress: dict) -> None:
    body = {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": {"trainerStatus": progress}}
    response = worker.custom.api_client.call_api(*worker.custom.api_client.param_serialize(
        "PATCH", f"/apis/{TRAINER[0]}/{TRAINER[1]}/namespaces/{namespace}/trainjobs/{name}/status",
        query_params=[("fieldManager", ts.FIELD_MANAGER), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml"},
        body=json.dumps(body), auth_settings=["BearerToken"]))
    answer = response.read()
    assert response.status == 200, f"expected the status apply to succeed; saw {answer!r}"


def test_the_manager_shows_the_trainers_progress(dispatch_env, namespace):
    create(dispatch_env.manager, namespace, trainjob("progress"))
    worker_name, _ = wait_placed(dispatch_env, namespace, "progress")
    worker = dispatch_env.multicluster[worker_name]
    eventually(lambda: get(worker, namespace, "progress"), lambda job: job is not None,
               expected=f"the copy of progress on {worker_name}")
    report(worker, namespace, "progress", PROGRESS)

    # The report travels with the rest of the copy's status (the operator's conditions).
    eventually(lambda: (get(dispatch_env.manager, namespace, "progress") or {}).get("status")
               or {}, lambda status: status.get("trainerStatus") == PROGRESS and any(
                   x["type"] == "Created" for x in status.get("conditions") or []),
               expected="the manager TrainJob showing the worker's trainerStatus and the "
                        "operator's Created condition")

    # A later report replaces it on the manager too.
    later = {"progressPercentage": 80, "lastUpdatedTime": "2025-06-01T12:10:00Z"}
    report(worker, namespace, "progress", later)
    eventually(lambda: get(dispatch_env.manager, namespace, "progress"),
               lambda job: (job.get("status") or {}).get("trainerStatus") == later,
               expected="the manager TrainJob showing the later report")
