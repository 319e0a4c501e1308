"""Real API errors (429, 5xx) and a frozen worker apiserver: the dispatcher retries with
backoff, writes nothing twice, and one broken worker does not slow the others.

The errors come from the real apiservers: an admission webhook served by the test makes
them refuse the first N requests of a kind with the chosen status code.
"""

from __future__ import annotations

import os
import signal
import time

from clusters import fixtures
from clusters.admission_faults import AdmissionFaults
from clusters.testing import eventually, holds_for, machine_load, stretched
from trainjob import constants as c

from dispatch_helpers import (
    active,
    complete_jobset,
    condition,
    create,
    get,
    idle_workers,
    placement,
    remotes,
    trainjob,
    wait_placed,
)


def faults(env, cluster, tmp_path, namespace: str, resource: str, operations: tuple[str, ...],
           code: int, count: int) -> AdmissionFaults:
    return AdmissionFaults(env.multicluster.harness, cluster, tmp_path / f"faults-{cluster.name}",
                           namespace, resource, operations, code, count)


def api_requests(env, cluster: str, code: str) -> float:
    """dispatcher_api_requests_total for ``cluster`` with status ``code``, summed over verbs."""
    _, text = env.dispatcher.get("/metrics")
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("dispatcher_api_requests_total{") and f'cluster="{cluster}"' in line
                and f'code="{code}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


REFUSED = 6


def test_refused_remote_creates_are_retried_with_backoff_and_create_one_copy(
        dispatch_env, namespace, tmp_path):
    env = dispatch_env
    # A dispatcher that has just started still syncs its workers' caches, and the events of
    # that can retry the job early: start from both workers answering.
    idle_workers(env)
    before = {w: api_requests(env, w, "429") for w in ("worker-1", "worker-2")}
    # Both workers refuse, so wherever the job goes, its first creates fail.
    with faults(env, env.multicluster["worker-1"], tmp_path, namespace, "trainjobs",
                ("CREATE",), 429, REFUSED) as one, \
            faults(env, env.multicluster["worker-2"], tmp_path, namespace, "trainjobs",
                   ("CREATE",), 429, REFUSED) as two:
        create(env.manager, namespace, trainjob("throttled"))
        worker, _ = wait_placed(env, namespace, "throttled")
        webhook = one if worker == "worker-1" else two
        assert (webhook.refused, webhook.allowed) == (REFUSED, 1), (
            f"expected {REFUSED} refused creates then 1 allowed on {worker}; "
            f"saw {webhook.seen}")
        # Per-job exponential backoff (50 ms doubling: 1.55 s over five waits). An event
        # about the job may trigger one early retry, so the bound is half of that; a hot
        # loop would be done in a few tens of milliseconds.
        span = webhook.seen[REFUSED].at - webhook.seen[0].at
        assert span > 0.75, f"{REFUSED + 1} attempts within {span:.2f}s: {webhook.seen}"
    assert api_requests(env, worker, "429") - before[worker] >= REFUSED
    assert list(remotes(env, namespace, "throttled")) == [worker]


def test_refused_status_writes_on_the_manager_are_retried_until_the_status_is_there(
        dispatch_env, namespace, tmp_path):
    env = dispatch_env
    create(env.manager, namespace, trainjob("status-503"))
    worker, _ = wait_placed(env, namespace, "status-503")
    eventually(lambda: get(env.multicluster[worker], namespace, "status-503", c.JOBSETS,
                           (c.JOBSET_GROUP, c.JOBSET_VERSION)),
               lambda js: js is not None, expected="the operator's JobSet on the worker")
    with faults(env, env.manager, tmp_path, namespace, "trainjobs/status", ("UPDATE",),
                503, 4) as webhook:
        complete_jobset(env.multicluster[worker], namespace, "status-503")
        done = eventually(lambda: get(env.manager, namespace, "status-503"),
                          lambda obj: (condition(obj, "Complete") or {}).get("status") == "True",
                          timeout=60, expected="Complete=True mirrored to the manager")
        assert webhook.refused == 4, f"expected 4 refused status writes; saw {webhook.seen}"
    assert placement(done) == worker


def test_refused_remote_deletes_are_retried_until_the_copy_is_gone(
        dispatch_env, namespace, tmp_path):
    env = dispatch_env
    create(env.manager, namespace, trainjob("delete-500"))
    worker, _ = wait_placed(env, namespace, "delete-500")
    with faults(env, env.multicluster[worker], tmp_path, namespace, "trainjobs", ("DELETE",),
                500, 3) as webhook:
        env.manager.custom.delete_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, "delete-500")
        eventually(lambda: (get(env.manager, namespace, "delete-500"),
                            remotes(env, namespace, "delete-500")),
                   lambda seen: seen == (None, {}), timeout=60,
                   expected="the manager job and its remote copy both gone")
        assert webhook.refused == 3 and webhook.allowed >= 1, webhook.seen


def test_a_frozen_worker_apiserver_does_not_slow_the_other_worker(dispatch_env, namespace):
    env = dispatch_env
    resource = f"example.com/{namespace}"
    node = f"only-{namespace}"
    # Jobs asking for this resource fit worker-2 only.
    fixtures.add_node(env.multicluster["worker-2"].api, node,
                      {"cpu": "8", "memory": "16Gi", resource: "100"})
    create(env.manager, namespace, trainjob("running", requests={"cpu": "10m", resource: "1"}))
    assert wait_placed(env, namespace, "running")[0] == "worker-2"
    eventually(lambda: get(env.multicluster["worker-2"], namespace, "running", c.JOBSETS,
                           (c.JOBSET_GROUP, c.JOBSET_VERSION)),
               lambda js: js is not None, expected="the operator's JobSet on worker-2")

    record = next(r for r in env.multicluster.harness.load().clusters if r.name == "worker-1")
    apiserver = record.pids["kube-apiserver"]
    # Stopped, not killed: connections stay open and requests hang unanswered, which is
    # harder on a client than a refused connection.
    os.kill(apiserver, signal.SIGSTOP)
    try:
        eventually(lambda: active(env, "worker-1"),
                   lambda cond: cond.get("status") == "False", timeout=20,
                   expected="worker-1 Active=False while its apiserver is frozen")
        started = time.monotonic()
        for i in range(5):
            create(env.manager, namespace, trainjob(f"during-{i}",
                                                    requests={"cpu": "10m", resource: "1"}))
        worker2 = env.multicluster["worker-2"]
        for i in range(5):
            # Only worker-2 is read: the test's own client would hang on worker-1 too.
            eventually(lambda n=f"during-{i}": (placement(get(env.manager, namespace, n)),
                                                get(worker2, namespace, n) is not None),
                       lambda seen: seen == ("worker-2", True), timeout=20,
                       expected=f"during-{i} placed on worker-2 with its copy there")
        complete_jobset(env.multicluster["worker-2"], namespace, "running")
        eventually(lambda: get(env.manager, namespace, "running"),
                   lambda obj: (condition(obj, "Complete") or {}).get("status") == "True",
                   timeout=20, expected="worker-2's status still mirrored promptly")
        elapsed = time.monotonic() - started
        # On an idle machine this takes well under a second; the bound is for a loaded CI
        # machine (stretched by its load), and below what one hung request (30 s timeout)
        # would cost.
        assert elapsed < min(stretched(15), 28), (
            f"5 dispatches and 1 status sync took {elapsed:.1f}s ({machine_load()})")
    finally:
        os.kill(apiserver, signal.SIGCONT)
        env.multicluster["worker-2"].core.delete_node(node)
    eventually(lambda: active(env, "worker-1"),
               lambda cond: cond.get("status") == "True", timeout=60,
               expected="worker-1 Active=True again after its apiserver resumed")


def test_a_copy_every_worker_refuses_waits_with_their_reasons_until_the_spec_changes(
        dispatch_env, namespace, tmp_path):
    env = dispatch_env
    with faults(env, env.multicluster["worker-1"], tmp_path, namespace, "trainjobs",
                ("CREATE",), 422, 1) as one, \
            faults(env, env.multicluster["worker-2"], tmp_path, namespace, "trainjobs",
                   ("CREATE",), 422, 1) as two:
        create(env.manager, namespace, trainjob("refused"))

        def refused_everywhere(obj):
            message = (condition(obj, "Placed") or {}).get("message", "")
            return all(f"{w}: refused the copy: " in message for w in ("worker-1", "worker-2"))

        pending = eventually(lambda: get(env.manager, namespace, "refused"), refused_everywhere,
                             expected="Placed=False naming both workers' refusals")
        message = condition(pending, "Placed")["message"]
        assert "injected fault: 422" in message, message
        assert placement(pending) is None and c.DISPATCH_FINALIZER not in (
            pending["metadata"].get("finalizers") or []), pending["metadata"]
        eventually(lambda: sorted(e.reason for e in env.manager.core.list_namespaced_event(
                       namespace, field_selector="involvedObject.name=refused").items
                       if e.reason == "RemoteRejected"),
                   lambda reasons: len(reasons) == 2,
                   expected="one RemoteRejected Event per worker")
        # The same spec is not offered again: no retry loop against the workers.
        holds_for(lambda: (one.refused, two.refused, one.allowed, two.allowed),
                  lambda seen: seen == (1, 1, 0, 0), seconds=2,
                  expected="one refused create per worker and no further attempt")

        # The user changes the spec (a new generation): the workers are asked again.
        env.manager.custom.patch_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, "refused",
            {"spec": {"annotations": {"example.com/fixed": "1"}}})
        worker, remote = wait_placed(env, namespace, "refused")
        assert remote["spec"]["annotations"] == {"example.com/fixed": "1"}, remote["spec"]
