"""``python -m dispatcher status``: clusters and multicluster TrainJobs as the manager's
objects describe them, like ``kubectl get``. Reads the API directly, so it works whether
or not a dispatcher is running.

The workers' room (allocatable, used, reserved, free per resource) is not in any API
object: only a running dispatcher knows it, from its watches of every worker's Nodes and
Pods and the jobs it placed. With ``--dispatcher-url`` it is read from that dispatcher's
dashboard (``/api/state``, the JSON the page draws, so both say the same); without it, or
when that dispatcher cannot be reached, the table says so and why, and the rest is shown
all the same. The order in which waiting jobs get room (their place in line and priority)
is that dispatcher's too, and is listed from the same answer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher.job_state import age, condition, job_summary, workloads_by_job
from trainjob import constants as c
from trainjob import managed_by, required_apis

# Where the dashboard serves its JSON; how long the status command waits for it.
STATE_PATH = "/api/state"
STATE_TIMEOUT_SECONDS = 5.0
CAPACITY_STATES = ("allocatable", "used", "reserved", "free")


def worker_capacity(dispatcher_url: str | None) -> dict[str, Any]:
    """Each worker's room per resource, as the dispatcher at ``dispatcher_url`` (its
    dashboard) reports it: ``available`` False with ``reason`` when it cannot be had."""
    if not dispatcher_url:
        return {"available": False, "source": None,
                "reason": "not asked: give --dispatcher-url (a running dispatcher's dashboard, "
                          "e.g. http://127.0.0.1:8082 through kubectl port-forward) to see it"}
    url = dispatcher_url.rstrip("/") + STATE_PATH
    if not url.startswith(("http://", "https://")):
        return {"available": False, "source": url,
                "reason": f"--dispatcher-url {dispatcher_url}: not an http:// or https:// URL"}
    try:
        with urllib.request.urlopen(url, timeout=STATE_TIMEOUT_SECONDS) as answer:  # noqa: S310 - scheme checked above
            state = json.loads(answer.read())
        rows = [{"worker": cluster["name"], "resource": row["resource"],
                 **{kind: row[kind] for kind in CAPACITY_STATES},
                 "display": row.get("display") or {}}
                for cluster in state["clusters"] for row in cluster.get("capacity") or []]
    except urllib.error.HTTPError as err:
        return {"available": False, "source": url,
                "reason": f"{url} answered {err.code} {err.reason}"}
    except (urllib.error.URLError, OSError) as err:
        why = getattr(err, "reason", None) or err
        return {"available": False, "source": url, "reason": f"cannot reach {url}: {why}"}
    except (ValueError, KeyError, TypeError) as err:
        return {"available": False, "source": url,
                "reason": f"{url} did not answer with a dispatcher's state: {err!r}"}
    # The order waiting jobs get room in (standalone mode; older dispatchers send none).
    line = [{key: entry.get(key) for key in ("position", "namespace", "name", "priority",
                                             "priorityClass", "candidates")}
            for entry in state.get("waitingLine") or [] if isinstance(entry, dict)]
    return {"available": True, "source": url, "reason": "", "capacity": rows,
            "waitingLine": line}


def collect(api: client.ApiClient, dispatcher_url: str | None = None) -> dict[str, Any]:
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
    return {"clusters": clusters, "trainJobs": jobs, "workers": worker_capacity(dispatcher_url)}


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
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
             _workers_table(report.get("workers") or {}),
             _table(jobs) if report["trainJobs"] else "no multicluster TrainJob"]
    if line := (report.get("workers") or {}).get("waitingLine"):
        parts.append(_waiting_table(line))
    return "\n\n".join(parts)


def _waiting_table(line: list[dict[str, Any]]) -> str:
    """The jobs waiting for room, in the order they get it (highest priority, then oldest)."""
    return _table([("POSITION", "NAMESPACE", "TRAINJOB", "PRIORITY", "PRIORITYCLASS",
                    "COULD USE")] + [
        (str(x["position"]), x["namespace"], x["name"], str(x["priority"]),
         x["priorityClass"] or "-", ",".join(x["candidates"] or []) or "-") for x in line])


def _workers_table(workers: dict[str, Any]) -> str:
    if not workers.get("available"):
        return f"worker capacity unavailable: {workers.get('reason', '')}"
    if not workers["capacity"]:
        return f"no worker capacity reported by {workers['source']}"
    return _table([("WORKER", "RESOURCE", "ALLOCATABLE", "USED", "RESERVED", "FREE")] + [
        (row["worker"], row["resource"],
         *(row["display"].get(kind) or row[kind] for kind in CAPACITY_STATES))
        for row in workers["capacity"]])
