"""What the dispatcher tests share: building and reading TrainJobs, where a job is placed
and copied, a worker's Active condition. One module, so no test module imports another."""

from __future__ import annotations

import time

from kubernetes.client.exceptions import ApiException

from clusters.machine_load import load_stretch
from clusters.testing import eventually
from trainjob import constants as c

RUNTIME = "torch-e2e"  # the runtime dispatch_env (conftest) installs on both workers
QUICK_RUNTIME = "torch-e2e-quick"  # its pods succeed a second after they start
# dispatch_env's dispatcher declares a worker lost after this many seconds unreachable on
# an idle machine (``worker_lost_timeout``: longer on a busy one): longer than the harness
# takes to stop and start a worker, so the tests of a short outage see nothing move.
WORKER_LOST_TIMEOUT = 30


def worker_lost_timeout() -> int:
    """``WORKER_LOST_TIMEOUT`` as far as the machine's load stretches it now, at most
    twice: restarting a worker's control plane takes longer on a busy machine, and a short
    outage must stay shorter than the timeout (at a load of 22-25 on two cores it stayed
    within 49 s). More would make the tests that wait for the timeout cost minutes."""
    return round(WORKER_LOST_TIMEOUT * load_stretch(most=2.0))


# The controllers' --python-gc-sweep-interval here (dispatch_env, conftest).
PYTHON_GC_SWEEP_SECONDS = 5
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)


def trainjob(name: str, *, managed_by: str | None = c.MANAGED_BY_MULTIKUEUE,
             runtime: str = RUNTIME, num_nodes: int = 1, requests: dict | None = None,
             suspend: bool = False) -> dict:
    spec = {"runtimeRef": {"name": runtime}, "suspend": suspend,
            "trainer": {"numNodes": num_nodes,
                        "resourcesPerNode": {"requests": requests or {"cpu": "100m"}}}}
    if managed_by is not None:
        spec["managedBy"] = managed_by
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": "TrainJob",
            "metadata": {"name": name}, "spec": spec}


def create(cluster, namespace: str, body: dict) -> dict:
    return cluster.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, body)


def get(cluster, namespace: str, name: str, plural: str = c.TRAINJOBS,
        group_version=TRAINER) -> dict | None:
    try:
        return cluster.custom.get_namespaced_custom_object(*group_version, namespace, plural, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def placement(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)


def condition(obj: dict | None, type_: str) -> dict | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return item
    return None


def remotes(env, namespace: str, name: str) -> dict[str, dict]:
    """Every worker's copy of namespace/name."""
    found = {}
    for worker in env.multicluster.workers:
        obj = get(worker, namespace, name)
        if obj is not None:
            found[worker.name] = obj
    return found


def wait_placed(env, namespace: str, name: str, timeout: float = 60) -> tuple[str, dict]:
    """Until the manager job is placed and exactly that worker holds its remote copy."""
    def observe():
        manager_obj = get(env.manager, namespace, name)
        return placement(manager_obj), remotes(env, namespace, name)

    worker, copies = eventually(
        observe, lambda seen: seen[0] is not None and list(seen[1]) == [seen[0]],
        expected=f"{namespace}/{name} placed and its only remote copy on that worker",
        timeout=timeout)
    return worker, copies[worker]


def wait_pending(env, namespace: str, name: str, *says: str, timeout: float = 30) -> dict:
    """Until the manager job's ``Placed`` condition is False for ``NoWorkerFits`` with a
    message holding every one of ``says``; returns the condition. The message is the one
    that follows the workers' caches: a worker's Namespace cache can trail a test's new
    namespace by a moment, and the first message then says "namespace ... not found" for
    that worker."""
    return eventually(
        lambda: condition(get(env.manager, namespace, name), "Placed") or {},
        lambda placed: placed.get("reason") == c.REASON_NO_WORKER
        and all(part in placed.get("message", "") for part in says),
        expected=f"{namespace}/{name} Placed=False {c.REASON_NO_WORKER}, the message saying "
                 f"{list(says)}", timeout=timeout)


def wait_no_namespace_terminating(env) -> None:
    """Until earlier tests' namespaces (and their pods) are gone on every cluster, so what a
    test counts or expects to stay quiet is its own."""
    for cluster in env.multicluster:
        eventually(lambda cl=cluster: [n.metadata.name for n in cl.core.list_namespace().items
                                       if n.status.phase == "Terminating"],
                   lambda names: names == [], timeout=120,
                   expected=f"no namespace terminating on {cluster.name}")


def complete_jobset(worker_cluster, namespace: str, name: str,
                    type_: str = "Completed", reason: str = "AllJobsCompleted") -> None:
    """Finish the JobSet the worker's operator made for the copy, as the JobSet controller
    would: once it exists (the copy may be only moments old)."""
    def jobset():
        try:
            return worker_cluster.custom.get_namespaced_custom_object(
                c.JOBSET_GROUP, c.JOBSET_VERSION, namespace, c.JOBSETS, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
    eventually(jobset, lambda obj: obj is not None, timeout=30,
               expected=f"JobSet {namespace}/{name} made by the operator on "
                        f"{worker_cluster.name}")
    worker_cluster.custom.patch_namespaced_custom_object_status(
        c.JOBSET_GROUP, c.JOBSET_VERSION, namespace, c.JOBSETS, name, {"status": {
            "conditions": [{"type": type_, "status": "True", "reason": reason,
                            "message": f"jobset {type_.lower()} (written by the test)",
                            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                time.gmtime())}],
            "replicatedJobsStatus": [{"name": "node", "ready": 0, "succeeded": 2,
                                      "failed": 0, "active": 0, "suspended": 0}],
        }}, _content_type="application/merge-patch+json")


MK = ("kueue.x-k8s.io", "v1beta2", "multikueueclusters")
CONFIG = "e2e"


def active(env, name: str) -> dict:
    obj = env.manager.custom.get_cluster_custom_object(*MK, name)
    return next((x for x in (obj.get("status") or {}).get("conditions") or []
                 if x["type"] == "Active"), {})


def idle_workers(env) -> None:
    """The precondition of a test that relies on best fit putting a small job on worker-1
    (16 cpu against worker-2's 64): both workers answer, and no earlier test's namespace
    (with its pods, which hold room) is still going away."""
    for worker in ("worker-1", "worker-2"):
        eventually(lambda w=worker: active(env, w), lambda cond: cond.get("status") == "True",
                   timeout=60, expected=f"{worker} Active=True before the test")
    wait_no_namespace_terminating(env)


Look = tuple[str, float, float, str | None]  # worker, GET sent, answer seen, copy's uid


def look_at_copies(env, namespace: str, name: str, done, timeout: float = 60,
                   expected: str = "") -> list[Look]:
    """GET the job's copy on every worker, round after round, until ``done({worker: uid})``
    holds for a round; every look with when it was sent and answered."""
    looks: list[Look] = []

    def one_round() -> dict[str, str]:
        found = {}
        for worker in env.multicluster.workers:
            sent = time.monotonic()
            obj = get(worker, namespace, name)
            uid = obj["metadata"]["uid"] if obj else None
            looks.append((worker.name, sent, time.monotonic(), uid))
            if uid:
                found[worker.name] = uid
        return found

    eventually(one_round, done, timeout=timeout, interval=0.02,
               expected=expected or "the copies to settle")
    return looks


def copies_at_once(looks: list[Look]) -> list[str]:
    """Proof from ``looks`` that copies on two workers existed at one moment: a copy (one
    uid) seen on one worker both before and after a look found another worker's copy. A
    look pairs a sent and an answered time, so only such a bracket proves it."""
    proofs = []
    for worker, _, _, uid in looks:
        if uid is None:
            continue
        for other, sent, other_answered, other_uid in looks:
            if other_uid is None or other == worker:
                continue
            before = any(w == worker and u == uid and a <= sent for w, _, a, u in looks)
            after = any(w == worker and u == uid and s >= other_answered for w, s, _, u in looks)
            if before and after:
                proofs.append(f"{worker}'s copy {uid} seen before and after {other}'s "
                              f"copy {other_uid}")
        if proofs:
            break
    return proofs
