"""``python -m dispatcher status``: clusters and multicluster TrainJobs as the manager's
objects describe them, like ``kubectl get``. Reads the API directly, so it works whether
or not a dispatcher is running."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher.job_state import age, condition, job_summary, workloads_by_job
from trainjob import constants as c
from trainjob import managed_by
from trainjob import required_apis


def collect(api: client.ApiClient) -> dict[str, Any]:
    required_apis.require(api, "manager", [required_apis.TRAINJOBS,
                                           required_apis.MULTIKUEUECLUSTERS,
                                           required_apis.MULTIKUEUECONFIGS])
    custom = client.CustomObjectsApi(api)
    clusters = []
    for obj in custom.list_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                 c.MULTIKUEUECLUSTERS)["items"]:
        active = condition(obj, "Active")
        clusters.append({"name": obj["metadata"]["name"],
                         "active": active.get("status", "Unknown"),
                         "reason": active.get("reason", ""),
                         "message": active.get("message", ""),
                         "age": age(obj["metadata"].get("creationTimestamp"))})
    # A name a MultiKueueConfig lists without a MultiKueueCluster: not used, and said so.
    known = {cluster["name"] for cluster in clusters}
    for config in custom.list_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                    c.MULTIKUEUECONFIGS)["items"]:
        for name in (config.get("spec") or {}).get("clusters") or []:
            if name not in known:
                known.add(name)
                clusters.append({"name": name, "active": "Missing", "reason": "NotFound",
                                 "message": f"listed by MultiKueueConfig "
                                            f"{config['metadata']['name']}, but no "
                                            "MultiKueueCluster has that name",
                                 "age": "-"})
    try:
        workloads = workloads_by_job(custom.list_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, "workloads")["items"])
    except ApiException as err:
        if err.status != 404:
            raise
        workloads = {}  # no Kueue on this manager
    jobs = [job_summary(obj, workloads.get((obj["metadata"]["namespace"],
                                            obj["metadata"]["name"])))
            for obj in custom.list_cluster_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS)["items"]
            if managed_by.dispatched(obj)]
    return {"clusters": clusters, "trainJobs": jobs}


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def render(report: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(report, indent=2)
    clusters = [("CLUSTER", "ACTIVE", "REASON", "AGE")] + [
        (x["name"], x["active"], x["reason"], x["age"]) for x in report["clusters"]]
    jobs = [("NAMESPACE", "TRAINJOB", "WORKER", "STATE", "ACTIVE/SUCCEEDED", "AGE")] + [
        (x["namespace"], x["name"], x["worker"] or "-", x["state"],
         f"{sum(j.get('active', 0) for j in x['jobsStatus'])}/"
         f"{sum(j.get('succeeded', 0) for j in x['jobsStatus'])}", x["age"])
        for x in sorted(report["trainJobs"], key=lambda j: (j["namespace"], j["name"]))]
    parts = [_table(clusters) if report["clusters"] else "no MultiKueueCluster",
             _table(jobs) if report["trainJobs"] else "no multicluster TrainJob"]
    return "\n\n".join(parts)
