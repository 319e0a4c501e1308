"""The dispatcher beside real Kueue (v0.19, ``kueue_multicluster``: a manager and two
workers, each running Kueue; the training operator on each worker; real JobSets and pods
on kwok).

Capacity: worker-1 has the most Kueue quota (64 cpu) but one Node of 8 cpu; worker-2 has
less quota (32 cpu) and a Node of 16 cpu. The manager's ClusterQueue (100 cpu) requires
the MultiKueue AdmissionCheck. A test that shrinks a worker's quota restores it.

Who wrote what is read from the apiservers' audit logs (clusters running Kueue keep one),
by the User-Agent each component sends, never from the components' own logs.

The dispatcher reads each worker as manifests/worker-reader's read-only ServiceAccount,
with its own Secret per worker in its own namespace (``kueue_queues.DISPATCHER_NAMESPACE``);
Kueue connects with its Secrets of the same names in ``kueue-system`` (admin kubeconfigs).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, kueue, kueue_queues, kustomize, worker_stack
from clusters.pki import service_account_user
from clusters.pytest_plugin import KUEUE_TEST_DISPATCHER, _namespace_name
from clusters.testing import ServiceProcess, audited_writes, eventually, holds_for
from controller_kit.kubeclient import api_client
from trainjob import constants as c

from dispatch_helpers import TRAINER, condition, get, placement, trainjob

CONFIG = "kueue-e2e"
RUNTIME = "torch-kueue"  # its pods run for RUN_FOR, then succeed
RUN_FOR = "5s"
WORKERS = {"worker-1": {"node_cpu": "8", "quota_cpu": "64"},
           "worker-2": {"node_cpu": "16", "quota_cpu": "32"}}


@dataclass
class KueueEnv:
    multicluster: object
    log_dir: object
    readers: dict[str, Path]  # worker -> kubeconfig of its worker-reader identity

    @property
    def manager(self):
        return self.multicluster.manager


@pytest.fixture(scope="module")
def kueue_env(kueue_multicluster, tmp_path_factory):
    mc = kueue_multicluster
    log_dir = tmp_path_factory.mktemp("kueue-logs")
    for cluster in mc:
        fixtures.install_runtime(cluster.api, fixtures.torch_runtime(
            RUNTIME, cpu="100m", memory="128Mi",
            pod_annotations={worker_stack.RUN_FOR_ANNOTATION: RUN_FOR}))
    for name, sizes in WORKERS.items():
        fixtures.add_node(mc[name].api, f"{name}-kueue",
                          {"cpu": sizes["node_cpu"], "memory": "64Gi", "pods": "110"})
        kueue_queues.cluster_queue(mc[name].api, {"cpu": sizes["quota_cpu"], "memory": "256Gi"})
    readers = {name: kueue_queues.worker_reader(mc.harness, name, mc[name].kubeconfig,
                                                log_dir / f"{name}-reader.kubeconfig")
               for name in WORKERS}
    kueue_queues.multikueue_manager(mc.manager.api, CONFIG,
                                    {name: mc[name].kubeconfig for name in WORKERS},
                                    {"cpu": "100", "memory": "512Gi"}, dispatcher=readers)
    operators = [ServiceProcess("training_operator", mc[name].kubeconfig,
                                log_dir / f"operator-{name}.log", ()).start()
                 for name in WORKERS]
    yield KueueEnv(mc, log_dir, readers)
    for process in operators:
        process.stop()


@pytest.fixture
def kueue_namespace(kueue_env, request):
    """A namespace on every Kueue cluster, with the LocalQueue jobs are submitted to."""
    name = _namespace_name(request.node.name)
    for cluster in kueue_env.multicluster:
        cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        kueue_queues.local_queue(cluster.api, name)
    yield name
    for cluster in kueue_env.multicluster:
        cluster.core.delete_namespace(name)


def queued_trainjob(name: str, cpu: str = "100m") -> dict:
    """A TrainJob submitted to Kueue's LocalQueue, as a Kueue user writes it."""
    body = trainjob(name, runtime=RUNTIME, requests={"cpu": cpu})
    body["metadata"]["labels"] = {c.KUEUE_QUEUE_NAME_LABEL: kueue_queues.LOCAL_QUEUE}
    return body


def finished(obj: dict | None) -> bool:
    return any((condition(obj, t) or {}).get("status") == "True"
               for t in (c.CONDITION_COMPLETE, c.CONDITION_FAILED))


@pytest.fixture
def kueue_dispatcher(kueue_env):
    """The dispatcher as Kueue's external dispatcher (the manager's Kueue starts with
    ``dispatcherName: KUEUE_TEST_DISPATCHER``)."""
    started = datetime.datetime.now(datetime.UTC)
    process = ServiceProcess(
        "dispatcher", kueue_env.manager.kubeconfig, kueue_env.log_dir / "kueue-mode.log",
        ("--mode", "kueue", "--dispatcher-name", KUEUE_TEST_DISPATCHER,
         "--namespace", kueue_queues.DISPATCHER_NAMESPACE,
         "--multikueue-config", CONFIG, "--admission-timeout", "30", "--no-leader-elect",
         "--log-level", "debug")).start()
    process.started_at = started
    yield process
    process.stop()


def workload_of(cluster, namespace: str, job: str) -> dict | None:
    """The Workload Kueue made for TrainJob ``job``."""
    items = cluster.custom.list_namespaced_custom_object(
        c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads")["items"]
    return next((w for w in items if any(
        ref.get("kind") == "TrainJob" and ref.get("name") == job
        for ref in w["metadata"].get("ownerReferences") or [])), None)


def nominations(env, namespace: str) -> list[str]:
    """The Nominated Events the dispatcher wrote about Workloads in ``namespace``."""
    return [e.message for e in env.manager.core.list_namespaced_event(namespace).items
            if e.reason == "Nominated"]


def copies(env, namespace: str, name: str) -> dict[str, dict]:
    found = {w.name: get(w, namespace, name) for w in env.multicluster.workers}
    return {n: o for n, o in found.items() if o is not None}


def test_kueue_mode_full_path(kueue_env, kueue_dispatcher, kueue_namespace):
    """a. A queued TrainJob on the manager gets quota from Kueue, this dispatcher nominates
    a worker by capacity, Kueue copies the job there (and only there), the worker's Kueue
    admits it, the real JobSet and pods run on kwok, and the manager shows Complete."""
    env, ns = kueue_env, kueue_namespace
    env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                       queued_trainjob("full-path"))
    reserved = eventually(lambda: workload_of(env.manager, ns, "full-path"),
                          lambda w: w is not None and any(
                              x["type"] == "QuotaReserved" and x["status"] == "True"
                              for x in (w.get("status") or {}).get("conditions") or []),
                          expected="Kueue's quota reserved for the job's Workload", timeout=60)
    said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1, timeout=60,
                      expected="one Nominated Event from the dispatcher")
    nominated = said[0].rsplit(" ", 1)[-1]
    placed = eventually(lambda: copies(env, ns, "full-path"), lambda seen: bool(seen),
                        timeout=60, expected=f"Kueue's copy of the job on {nominated}")
    assert list(placed) == [nominated] and c.KUEUE_PREBUILT_WORKLOAD_LABEL in (
        placed[nominated]["metadata"].get("annotations") or {}), (
        f"expected Kueue's copy (prebuilt-workload annotation) only on the nominated "
        f"{nominated}; saw {({n: o['metadata'] for n, o in placed.items()})}")
    worker = env.multicluster[nominated]
    pods = eventually(lambda: worker.core.list_namespaced_pod(ns).items,
                      lambda items: len(items) == 3 and all(p.spec.node_name for p in items),
                      timeout=60, expected=f"the job's 3 pods bound to Nodes on {nominated}")
    assert {p.spec.node_name for p in pods} == {f"{nominated}-kueue"}, (
        f"expected every pod on {nominated}'s kwok Node; saw {[p.spec.node_name for p in pods]}")
    done = eventually(lambda: get(env.manager, ns, "full-path"), finished, timeout=90,
                      expected="the manager TrainJob finished")
    assert (condition(done, c.CONDITION_COMPLETE) or {}).get("status") == "True", (
        f"expected Complete on the manager; saw {done.get('status')}")
    admitted = workload_of(env.manager, ns, "full-path")
    assert admitted["status"].get("clusterName") == nominated and not admitted["status"].get(
        "nominatedClusterNames"), (
        f"expected Kueue to assign {nominated} and clear the nomination; saw "
        f"clusterName={admitted['status'].get('clusterName')}, "
        f"nominatedClusterNames={admitted['status'].get('nominatedClusterNames')}")
    report = subprocess.run([sys.executable, "-m", "dispatcher", "status", "--kubeconfig",
                             str(env.manager.kubeconfig), "-o", "json"],
                            capture_output=True, text=True, timeout=60)
    shown = [j for j in json.loads(report.stdout or "{}").get("trainJobs", [])
             if j["namespace"] == ns]
    assert [(j["name"], j["state"], j["worker"]) for j in shown] == [
        ("full-path", c.CONDITION_COMPLETE, nominated)], (
        f"expected `dispatcher status` to show the job Complete on {nominated} (from its "
        f"Workload); saw {shown or report.stderr[-400:]}")
    ours = [w for w in audited_writes(env.manager, c.DISPATCHER_USER_AGENT)
            if w["namespace"] == ns]
    assert {(w["resource"], w["subresource"], w["verb"]) for w in ours} <= {
        ("workloads", "status", "patch")} and ours, (
        f"expected the dispatcher's only writes to be the Workload's status (the nomination); "
        f"the audit log shows {ours} (reserved: {reserved['metadata']['name']})")


def test_kueue_mode_nominates_the_worker_with_room(kueue_env, kueue_dispatcher,
                                                   kueue_namespace):
    """b. A job too big for the Nodes of the worker with the most Kueue quota (worker-1:
    quota 64 cpu, one 8-cpu Node) is nominated to the worker with room (worker-2: quota 32
    cpu, a 16-cpu Node), and Kueue never copies it to worker-1."""
    env, ns = kueue_env, kueue_namespace
    env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                       queued_trainjob("big", cpu="12"))
    said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1, timeout=60,
                      expected="one Nominated Event from the dispatcher")
    assert said == ["nominated worker cluster worker-2"], (
        f"expected worker-2 (room on its Nodes), not worker-1 (most quota, too small); saw "
        f"{said}")
    eventually(lambda: copies(env, ns, "big"), lambda seen: list(seen) == ["worker-2"],
               timeout=60, expected="Kueue's copy on worker-2 only")
    done = eventually(lambda: get(env.manager, ns, "big"), finished, timeout=90,
                      expected="the manager TrainJob finished")
    assert (condition(done, c.CONDITION_COMPLETE) or {}).get("status") == "True", (
        f"expected Complete; saw {done.get('status')}")
    assert get(env.multicluster["worker-1"], ns, "big") is None, (
        "expected no copy on worker-1 at any point after the nomination")


def set_cpu_quota(cluster, cpu: str) -> None:
    """The worker's ClusterQueue with ``cpu`` of nominal quota (memory as the fixture's)."""
    kueue_queues.cluster_queue(cluster.api, {"cpu": cpu, "memory": "256Gi"})


def test_kueue_mode_nominates_by_the_workers_clusterqueue_quota(kueue_env, kueue_dispatcher,
                                                               kueue_namespace):
    """A job of 6 cpu fits the Nodes of both workers (8 and 16 cpu; best fit would take the
    tighter worker-1), but not worker-1's ClusterQueue quota once that is 4 cpu: while
    worker-2's quota is 4 cpu too, nothing is nominated and the reason names each
    ClusterQueue and its free quota; once worker-2's quota grows, the job is nominated
    there, Kueue admits it and it completes, never copied to worker-1."""
    env, ns = kueue_env, kueue_namespace
    first, second = env.multicluster["worker-1"], env.multicluster["worker-2"]
    set_cpu_quota(first, "4")
    set_cpu_quota(second, "4")
    try:
        def quotas_shown() -> dict[str, tuple[str, str] | None]:
            """Each worker's ClusterQueue cpu (nominal, free) as the dashboard shows it."""
            state = json.loads(kueue_dispatcher.get("/api/state")[1])
            shown = {}
            for cluster in state["clusters"]:
                queue = next((q for q in (cluster["quota"] or {}).get("clusterQueues") or []
                              if q["name"] == kueue_queues.CLUSTER_QUEUE), None)
                cpu = next((r for r in (queue or {}).get("resources") or []
                            if r["resource"] == "cpu"), None)
                shown[cluster["name"]] = (cpu["nominal"], cpu["free"]) if cpu else None
            return shown
        # The job comes once the dispatcher has read both new quotas (a job created before
        # would be nominated by the quota it read last, and rightly so).
        eventually(quotas_shown, lambda shown: all(shown.get(name) == ("4", "4")
                                                   for name in WORKERS), timeout=30,
                   expected="the dashboard showing each worker's ClusterQueue with 4 cpu, "
                            "4 free")
        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                           queued_trainjob("quota", cpu="6"))

        def waits() -> list[str]:
            return [e.message for e in env.manager.core.list_namespaced_event(ns).items
                    if e.reason == "NoWorkerFits"]
        # 6.2 cpu: the trainer's 6 and the runtime's other pods' 100m each.
        short = [f"{name}: ClusterQueue {kueue_queues.CLUSTER_QUEUE} (LocalQueue "
                 f"{ns}/{kueue_queues.LOCAL_QUEUE}) has too little quota: 6.2 cpu requested, "
                 "4 free (nominalQuota 4, reserved 0)" for name in WORKERS]
        eventually(waits, lambda seen: any(all(s in m for s in short) for m in seen),
                   timeout=60, expected=f"a NoWorkerFits Event naming both quotas: {short}")
        assert nominations(env, ns) == [], (
            f"expected no nomination while neither quota fits; saw {nominations(env, ns)}")
        # The dashboard still shows the quota that holds the job back (none reserved).
        shown = quotas_shown()
        assert all(shown.get(name) == ("4", "4") for name in WORKERS), (
            f"expected the dashboard to show each ClusterQueue with 4 cpu, 4 free; saw {shown}")

        set_cpu_quota(second, WORKERS["worker-2"]["quota_cpu"])
        said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1,
                          timeout=60, expected="a Nominated Event once worker-2's quota grew")
        assert said == ["nominated worker cluster worker-2"], (
            f"expected worker-2 (quota room), not worker-1 (Node room, 4 cpu of quota); "
            f"saw {said}")
        done = eventually(lambda: get(env.manager, ns, "quota"), finished, timeout=90,
                          expected="the manager TrainJob finished on worker-2")
        assert (condition(done, c.CONDITION_COMPLETE) or {}).get("status") == "True" and \
            workload_of(env.manager, ns, "quota")["status"].get("clusterName") == "worker-2", (
            f"expected Complete, admitted on worker-2; saw {done.get('status')}")
        assert get(first, ns, "quota") is None, "expected no copy on worker-1 at any point"
    finally:
        for name, sizes in WORKERS.items():
            set_cpu_quota(env.multicluster[name], sizes["quota_cpu"])


def secret_requests_since(cluster, since: datetime.datetime) -> list[dict]:
    """The dispatcher's requests (told by its User-Agent) for Secrets on ``cluster`` since
    ``since``, from its audit log: ``{verb, namespace, name}`` each."""
    found = {}
    for line in cluster.control_plane.audit_log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line the apiserver is still writing
        ref = record.get("objectRef") or {}
        if (record.get("userAgent") or "").startswith(c.DISPATCHER_USER_AGENT) and \
                ref.get("resource") == "secrets" and datetime.datetime.fromisoformat(
                    record["requestReceivedTimestamp"].replace("Z", "+00:00")) >= since:
            found[record["auditID"]] = {"verb": record.get("verb"),
                                        "namespace": ref.get("namespace", ""),
                                        "name": ref.get("name", "")}
    return list(found.values())


def test_the_dispatcher_reads_only_its_own_secrets_multikueueclusters_name(kueue_env,
                                                                          kueue_dispatcher,
                                                                          kueue_namespace):
    """The manager's audit log holds every request for a Secret: the dispatcher's each
    name, in its own namespace, a Secret one of its MultiKueueClusters names; it never
    lists the namespace, reads another Secret there (one created while it runs), nor asks
    for any Secret of Kueue's namespace, where Kueue's Secrets of the same names are; and
    it still nominates."""
    env, ns = kueue_env, kueue_namespace
    own = kueue_queues.DISPATCHER_NAMESPACE
    unnamed = f"unnamed-{ns}"[:63]
    env.manager.core.create_namespaced_secret(own, client.V1Secret(
        metadata=client.V1ObjectMeta(name=unnamed),
        string_data={"token": "no MultiKueueCluster names this Secret"}))
    try:
        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                           queued_trainjob("secrets"))
        eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1, timeout=60,
                   expected="one Nominated Event (the workers' Secrets were read)")
        named = {env.manager.custom.get_cluster_custom_object(
                     c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, name)[
                     "spec"]["clusterSource"]["kubeConfig"]["location"] for name in WORKERS}
        read = secret_requests_since(env.manager, kueue_dispatcher.started_at)
        assert read and {(r["namespace"], r["name"]) for r in read} <= {
            (own, name) for name in named}, (
            f"expected the dispatcher's Secret requests to name only {sorted(named)} in "
            f"{own} (one watch each), none in {kueue.NAMESPACE}; the audit log shows "
            f"{sorted({(r['verb'], r['namespace'], r['name']) for r in read})}")
        assert {r["verb"] for r in read} <= {"list", "watch"}, read
    finally:
        env.manager.core.delete_namespaced_secret(unnamed, own)


def test_kueue_mode_nominates_the_next_worker_when_one_does_not_admit(kueue_env,
                                                                     kueue_namespace):
    """A nominated worker whose Kueue does not admit within the admission timeout (its
    ClusterQueue is held) is recorded as tried, and the next worker with room is
    nominated; Kueue moves the copy there and the job completes."""
    env, ns = kueue_env, kueue_namespace
    held = env.multicluster["worker-1"]
    queue = (c.KUEUE_GROUP, c.KUEUE_VERSION, "clusterqueues", kueue_queues.CLUSTER_QUEUE)
    held.custom.patch_cluster_custom_object(*queue, {"spec": {"stopPolicy": "Hold"}})
    dispatcher = ServiceProcess(
        "dispatcher", env.manager.kubeconfig, env.log_dir / "kueue-mode-timeout.log",
        ("--mode", "kueue", "--dispatcher-name", KUEUE_TEST_DISPATCHER,
         "--namespace", kueue_queues.DISPATCHER_NAMESPACE,
         "--multikueue-config", CONFIG, "--admission-timeout", "6", "--no-leader-elect",
         "--log-level", "debug")).start()
    try:
        # 6 cpu fits both workers' Nodes; best fit tries the tighter worker-1 first.
        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                           queued_trainjob("retried", cpu="6"))
        said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 2,
                          timeout=90, expected="a second Nominated Event after the timeout")
        assert sorted(said) == ["nominated worker cluster worker-1",
                                "nominated worker cluster worker-2"], (
            f"expected worker-1 (tighter fit) then worker-2; saw {said}")
        timed_out = [e.message for e in env.manager.core.list_namespaced_event(ns).items
                     if e.reason == "NominationTimedOut"]
        assert timed_out == ["worker worker-1 did not admit the Workload within 6s; "
                             "nominating the next"], f"expected one timeout Event; saw {timed_out}"
        done = eventually(lambda: get(env.manager, ns, "retried"), finished, timeout=90,
                          expected="the manager TrainJob finished on worker-2")
        workload = workload_of(env.manager, ns, "retried")
        assert (condition(done, c.CONDITION_COMPLETE) or {}).get("status") == "True" and \
            workload["status"].get("clusterName") == "worker-2" and (
                workload["metadata"].get("annotations") or {}).get(
                "trainjob-dispatcher.io/tried-clusters") == "worker-1", (
            f"expected Complete on worker-2 with worker-1 recorded as tried; saw "
            f"{done.get('status')}, {workload['status'].get('clusterName')}, "
            f"{workload['metadata'].get('annotations')}")
    finally:
        dispatcher.stop()
        held.custom.patch_cluster_custom_object(*queue, {"spec": {"stopPolicy": "None"}})


def test_standalone_dispatcher_leaves_kueue_jobs_alone(kueue_env, kueue_namespace):
    """c. Kueue (AllAtOnce) runs a queued job while a standalone dispatcher runs on the same
    manager: the dispatcher refuses Kueue's origin, and with its own (the default) it
    creates, deletes and writes nothing for Kueue's job (not the job, its copies, Workloads
    or the MultiKueueCluster conditions), while it still dispatches a job of its own."""
    env, ns = kueue_env, kueue_namespace
    harness = env.multicluster.harness
    harness.use_kueue_dispatcher("manager", kueue.DISPATCHER_ALL_AT_ONCE)
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "dispatcher", "run", "--kubeconfig",
             str(env.manager.kubeconfig), "--metrics-port", "0",
             "--origin", c.KUEUE_DEFAULT_ORIGIN],
            capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "--origin multikueue: Kueue runs on this manager" \
            in refused.stderr and "kueue-system/kueue-manager-config" in refused.stderr, (
            f"expected a refusal of Kueue's origin naming its ConfigMap (exit 2); saw exit "
            f"{refused.returncode}: {refused.stderr[-600:]}")

        dispatcher = ServiceProcess(
            "dispatcher", env.manager.kubeconfig, env.log_dir / "standalone.log",
            ("--multikueue-config", CONFIG, "--gc-interval", "1", "--no-leader-elect",
             "--log-level", "debug")).start()
        try:
            env.manager.custom.create_namespaced_custom_object(
                *TRAINER, ns, c.TRAINJOBS, queued_trainjob("kueued"))
            env.manager.custom.create_namespaced_custom_object(
                *TRAINER, ns, c.TRAINJOBS, trainjob("own", runtime=RUNTIME))

            # Kueue's copy runs on a worker while the dispatcher's garbage collector sweeps
            # every second: it stays (same object) until Kueue itself is done with it.
            def kueue_copy():
                copies = {w.name: get(w, ns, "kueued") for w in env.multicluster.workers}
                return {n: o["metadata"]["uid"] for n, o in copies.items()
                        if o is not None and not finished(o)}
            running = eventually(kueue_copy, lambda seen: len(seen) == 1, timeout=90,
                                 expected="Kueue's copy of the queued job on one worker")
            holds_for(kueue_copy, lambda seen: seen == running, seconds=2.5,
                      expected=f"Kueue's copy {running} untouched by the standalone "
                               "dispatcher's garbage collection")

            for name in ("kueued", "own"):
                eventually(lambda n=name: get(env.manager, ns, n), finished, timeout=120,
                           expected=f"manager TrainJob {ns}/{name} finished")
            kueued = get(env.manager, ns, "kueued")
            assert (condition(kueued, c.CONDITION_COMPLETE) or {}).get("status") == "True" \
                and placement(kueued) is None and c.DISPATCH_FINALIZER not in (
                    kueued["metadata"].get("finalizers") or []), (
                f"expected Kueue's job Complete with no placement or finalizer of ours; saw "
                f"{kueued['metadata'].get('annotations')}, "
                f"{kueued['metadata'].get('finalizers')}, {kueued.get('status')}")

            writes = {cl.name: audited_writes(cl, c.DISPATCHER_USER_AGENT)
                      for cl in env.multicluster}
            touching_kueue = {n: [w for w in ws if w["name"] == "kueued"
                                  or w["name"].startswith("trainjob-kueued-")
                                  or w["resource"] == c.MULTIKUEUECLUSTERS]
                              for n, ws in writes.items()}
            assert touching_kueue == {n: [] for n in writes}, (
                f"expected no write by the dispatcher to Kueue's job, its copies, Workloads or "
                f"the MultiKueueClusters; the audit logs show {touching_kueue}")
            own = [w for ws in writes.values() for w in ws
                   if w["name"] == "own" and w["verb"] == "create"]
            assert own, (f"expected the audit logs to show the dispatcher creating the copy of "
                         f"its own job (proof the logs see its writes); saw {writes}")

            events = env.manager.core.list_namespaced_event(
                ns, field_selector="involvedObject.name=kueued").items
            left = [e for e in events if e.reason == "LeftToKueue"]
            assert len(left) == 1 and c.KUEUE_QUEUE_NAME_LABEL in left[0].message and (
                left[0].count or 1) == 1, (
                f"expected one LeftToKueue Event naming the queue-name label; saw "
                f"{[(e.reason, e.message, e.count) for e in events]}")
        finally:
            dispatcher.stop()
    finally:
        harness.use_kueue_dispatcher("manager", KUEUE_TEST_DISPATCHER)



def test_kueue_mode_refuses_an_origin_that_is_not_kueues(kueue_env):
    """Kueue makes the copies in kueue mode and the dispatcher follows them by Kueue's
    origin: another origin is refused at start, naming Kueue's and where it was read."""
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", "run", "--kubeconfig",
         str(kueue_env.manager.kubeconfig), "--metrics-port", "0", "--no-leader-elect",
         "--mode", "kueue", "--namespace", kueue_queues.DISPATCHER_NAMESPACE,
         "--origin", c.DEFAULT_ORIGIN],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and (
        f"--origin {c.DEFAULT_ORIGIN}: in kueue mode the origin must be Kueue's, and Kueue "
        f"labels its remote copies {c.MULTIKUEUE_ORIGIN_LABEL}={c.KUEUE_DEFAULT_ORIGIN}"
        ) in done.stderr and f"{kueue.NAMESPACE}/kueue-manager-config" in done.stderr, (
        f"expected a refusal naming Kueue's origin and ConfigMap (exit 2); saw exit "
        f"{done.returncode}: {done.stderr[-600:]}")


# Applied for real from manifests/manager-kueue: what the dispatcher is and may do.
IDENTITY_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                  "RoleBinding"}


def test_kueue_mode_nominates_only_workers_the_jobs_cluster_selector_matches(
        kueue_env, kueue_dispatcher, kueue_namespace):
    """A small job best fit would nominate to worker-1 (its Nodes the fuller) goes to
    worker-2, the one worker whose MultiKueueCluster its cluster selector matches (read on
    the job through the Workload's owner). The quota metric says what the dashboard
    shows."""
    env, ns = kueue_env, kueue_namespace
    mkc = (c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS)

    def quota(worker: str) -> tuple[float, float | None]:
        """worker's ClusterQueue cpu left: (the gauge, the dashboard)."""
        gauge = kueue_dispatcher.metric("dispatcher_worker_quota_free", cluster=worker,
                                        cluster_queue=kueue_queues.CLUSTER_QUEUE,
                                        resource="cpu")
        state = json.loads(kueue_dispatcher.get("/api/state")[1])
        cluster = next(x for x in state["clusters"] if x["name"] == worker)
        queue = next((q for q in (cluster["quota"] or {}).get("clusterQueues") or []
                      if q["name"] == kueue_queues.CLUSTER_QUEUE), {})
        cpu = next((r["free"] for r in queue.get("resources") or [] if r["resource"] == "cpu"),
                   None)
        return gauge, None if cpu is None else float(cpu)
    eventually(lambda: quota("worker-1"), lambda seen: seen[0] > 0 and seen[0] == seen[1],
               timeout=30, expected="worker-1's cpu quota left, the same in the gauge and "
                                    "on the dashboard")
    env.manager.custom.patch_cluster_custom_object(
        *mkc, "worker-2", {"metadata": {"labels": {"example.com/zone": "b"}}},
        _content_type="application/merge-patch+json")
    try:
        body = queued_trainjob("picky")
        body["metadata"]["annotations"] = {
            "trainjob-dispatcher.io/cluster-selector": "example.com/zone in (b,c)"}
        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS, body)
        said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1,
                          timeout=60, expected="one Nominated Event from the dispatcher")
        assert said == ["nominated worker cluster worker-2"], (
            f"expected worker-2 (the only worker its selector matches), saw {said}")
        eventually(lambda: copies(env, ns, "picky"), lambda seen: list(seen) == ["worker-2"],
                   timeout=60, expected="Kueue's copy on worker-2 only")
    finally:
        env.manager.custom.patch_cluster_custom_object(
            *mkc, "worker-2", {"metadata": {"labels": {"example.com/zone": None}}},
            _content_type="application/merge-patch+json")


def forbidden(call, what: str) -> None:
    """``call`` is refused by RBAC (403), naming ``what`` when it is not."""
    try:
        call()
    except ApiException as err:
        assert err.status == 403, f"{what}: expected 403 Forbidden; got {err.status}: {err.body}"
        return
    raise AssertionError(f"{what}: expected 403 Forbidden; it was allowed")


def cluster_events(env, cluster: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about MultiKueueCluster ``cluster``."""
    # A cluster-scoped object's Events are in "default".
    events = env.manager.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={cluster}").items
    return [(e.type, e.reason, e.message) for e in events]


def test_kueue_mode_as_shipped_with_only_its_roles(kueue_env, kueue_namespace, tmp_path):
    """manifests/manager-kueue on a manager that runs Kueue, manifests/worker-reader on the
    workers (``kueue_env``): the RBAC applied (its worker Secrets are the sample workers',
    which are this environment's), the dispatcher run with its Deployment's flags as its
    ServiceAccount, reading each worker with its own Secret in its own namespace as the
    read-only identity. Its own Secret of worker-1 is missing at first: worker-1 is said
    unusable in a Warning Event on its MultiKueueCluster naming that Secret (Kueue's Active
    condition, from Kueue's own Secret, stays True) and the job is nominated to worker-2 and
    completes. Once the Secret is there, worker-1 is nominated by room. Kueue's Secret is
    unreadable to it, the read-only identity is refused writes on a worker, and RBAC refuses
    the dispatcher nothing it asks for."""
    env, ns = kueue_env, kueue_namespace
    objects = kustomize.render("manager-kueue")
    identities = [o for o in objects if o["kind"] in IDENTITY_KINDS]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    home = deployment["metadata"]["namespace"]
    assert home == kueue_queues.DISPATCHER_NAMESPACE, (home, "where kueue_env put the Secrets")
    account = (home, deployment["spec"]["template"]["spec"]["serviceAccountName"])
    kustomize.apply(env.manager.kubeconfig, identities)
    user, groups = service_account_user(*account)
    kubeconfig = env.multicluster.harness.issue_user_kubeconfig(
        "manager", user, groups, tmp_path / "dispatcher.kubeconfig")
    missing = "worker-1-kubeconfig"
    env.manager.core.delete_namespaced_secret(missing, home)
    # The Pod's flags, but for where it listens and how it logs (this is not a Pod).
    shipped = [arg.replace("$(POD_NAMESPACE)", home)
               for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:]
               if not arg.startswith(("--metrics-", "--dashboard-", "--health-", "--log-format"))]
    dispatcher = ServiceProcess("dispatcher", kubeconfig, env.log_dir / "kueue-shipped.log",
                                (*shipped, "--multikueue-config", CONFIG,
                                 "--log-level", "debug")).start()
    try:
        said = f"Secret {home}/{missing} not found"
        eventually(lambda: cluster_events(env, "worker-1"),
                   lambda seen: any(t == "Warning" and r == "BadKubeConfig" and said in m
                                    for t, r, m in seen), timeout=30,
                   expected=f"a Warning Event on MultiKueueCluster worker-1 saying '{said}'")
        kueues = env.manager.custom.get_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, "worker-1")
        assert (condition(kueues, "Active") or {}).get("status") == "True", (
            f"expected Kueue's Active condition (Kueue's own Secret) still True; saw "
            f"{condition(kueues, 'Active')}")

        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                           queued_trainjob("shipped"))
        said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1,
                          timeout=60, expected="one Nominated Event from the dispatcher")
        assert said == ["nominated worker cluster worker-2"], (
            f"expected worker-2, the one worker the dispatcher can read; saw {said}")
        done = eventually(lambda: get(env.manager, ns, "shipped"), finished, timeout=90,
                          expected="the manager TrainJob finished")
        assert (condition(done, c.CONDITION_COMPLETE) or {}).get("status") == "True", (
            f"expected Complete; saw {done.get('status')}")

        # Its own Secret back: worker-1 is read again, and best fit (6 cpu on its 8-cpu
        # Node, tighter than worker-2's 16) takes it.
        kueue_queues.dispatcher_secret(env.manager.api, "worker-1", env.readers["worker-1"],
                                       home)
        eventually(lambda: {x["name"]: x["active"] for x in json.loads(
                       dispatcher.get("/api/state")[1])["clusters"]},
                   lambda seen: seen.get("worker-1") is True, timeout=30,
                   expected="the dashboard showing worker-1 usable once its Secret is there")
        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS,
                                                           queued_trainjob("roomy", cpu="6"))
        said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 2,
                          timeout=60, expected="a second Nominated Event")
        assert sorted(said) == ["nominated worker cluster worker-1",
                                "nominated worker cluster worker-2"], (
            f"expected the 6-cpu job on worker-1 (tighter fit); saw {said}")

        lease = client.CoordinationV1Api(env.manager.api).read_namespaced_lease(
            f"trainjob-dispatcher-{c.KUEUE_DEFAULT_ORIGIN}", home)
        assert lease.spec.holder_identity, "expected the dispatcher to hold its Lease"
        refused = [line for line in dispatcher.log_file.read_text(errors="replace").splitlines()
                   if "forbidden" in line.lower() and '" cannot ' in line]
        assert not refused, "the dispatcher was refused by RBAC:\n" + "\n".join(refused[:10])

        # Kueue's Secrets, of the same names, are out of the dispatcher's reach...
        dispatcher_api = api_client(kubeconfig)
        own = client.CoreV1Api(dispatcher_api)
        try:
            for name in WORKERS:
                forbidden(lambda n=name: own.list_namespaced_secret(
                    kueue.NAMESPACE, field_selector=f"metadata.name={n}-kubeconfig"),
                    f"the dispatcher listing Kueue's Secret {kueue.NAMESPACE}/{name}-kubeconfig")
        finally:
            dispatcher_api.close()
        # ...and what it reads a worker with writes nothing there.
        reader_api = api_client(env.readers["worker-1"])
        try:
            reader, custom = client.CoreV1Api(reader_api), client.CustomObjectsApi(reader_api)
            assert reader.list_node().items and custom.list_cluster_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, "clusterqueues")["items"]
            forbidden(lambda: reader.create_namespaced_pod(ns, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneaky"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
                "the worker-reader identity creating a Pod")
            forbidden(lambda: custom.create_namespaced_custom_object(
                *TRAINER, ns, c.TRAINJOBS, trainjob("sneaky", runtime=RUNTIME)),
                "the worker-reader identity creating a TrainJob")
            forbidden(lambda: custom.patch_cluster_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, "clusterqueues", kueue_queues.CLUSTER_QUEUE,
                {"spec": {"stopPolicy": "Hold"}}),
                "the worker-reader identity holding a ClusterQueue")
            forbidden(lambda: reader.read_namespaced_secret(
                "trainjob-dispatcher-reader-token", kueue_queues.DISPATCHER_NAMESPACE),
                "the worker-reader identity reading a Secret")
        finally:
            reader_api.close()
    finally:
        dispatcher.stop()
        kueue_queues.dispatcher_secret(env.manager.api, "worker-1", env.readers["worker-1"],
                                       home)
        doomed = [o for o in identities if o["kind"] != "Namespace"]
        kustomize.kubectl(env.manager.kubeconfig, "delete", "--ignore-not-found",
                          "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(doomed))


# --- the worker's reasons on the manager, Kueue mode --------------------------------------

UNSCHEDULABLE = "kueue-missing-claim"  # its trainer Pod needs a claim nobody made
MISSING_CLAIM = "no-such-claim"


def _claiming_runtime(namespace: str) -> dict:
    """A TrainingRuntime of ``namespace`` whose trainer Pod mounts a PersistentVolumeClaim
    that is not there: Kueue and the dispatcher admit the job by its requests, the worker's
    scheduler cannot place that Pod (FailedScheduling)."""
    runtime = fixtures.torch_runtime(UNSCHEDULABLE, cpu="100m", memory="128Mi",
                                     namespace=namespace)
    [trainer] = [job for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                 if job["name"] == c.NODE]
    pod = trainer["template"]["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": MISSING_CLAIM}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return runtime


def _job_events(env, namespace: str, name: str, reason: str) -> list[tuple[str, int, str]]:
    """(message, count, source) of the Events of ``reason`` on the manager's TrainJob
    ``namespace/name`` (that very object)."""
    job = get(env.manager, namespace, name)
    if job is None:
        return []
    return [(e.message, e.count or 1, (e.source.component if e.source else "") or "")
            for e in env.manager.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.uid={job['metadata']['uid']},"
                                          f"reason={reason}").items]


def _scheduler_said(worker, namespace: str, pod: str) -> dict[str, int]:
    """The worker scheduler's FailedScheduling messages about ``pod``, each with how often
    it said it (over every Event object saying it: a count, a series, or several)."""
    said: dict[str, int] = {}
    for event in worker.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod},reason=FailedScheduling").items:
        times = max((event.series.count if event.series else 0) or 0, event.count or 0, 1)
        said[event.message] = said.get(event.message, 0) + times
    return said


def _remote_view_get(port: int, context, path: str) -> tuple[int, dict | str]:
    """GET ``path`` on the dispatcher's remote view as the aggregation layer would send it
    (its front-proxy certificate, a user of system:masters in the headers): the status and
    the JSON answer (a log: its text)."""
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        conn.request("GET", path, headers={"X-Remote-User": "kueue-admin",
                                           "X-Remote-Group": "system:masters"})
        answer = conn.getresponse()
        body = answer.read()
        if "json" in (answer.getheader("Content-Type") or ""):
            return answer.status, json.loads(body or b"{}")
        return answer.status, body.decode(errors="replace")
    finally:
        conn.close()


def test_kueue_mode_a_pod_its_worker_cannot_schedule_is_told_once_on_the_manager_job(
        kueue_env, kueue_namespace, tmp_path):
    """The dispatcher as shipped (manifests/manager-kueue's and manifests/remote-api's RBAC
    on the manager, as its ServiceAccount; the workers read as manifests/worker-reader):
    Kueue copies a job to the worker nominated, whose scheduler cannot place its trainer
    Pod. The manager's TrainJob gets one FailedScheduling Event naming the worker and the
    Pod, its count raised as often as the worker's scheduler says it again, never a second
    Event. The remote view reads the copy's Events as the reader identity, and a Pod's log
    once the worker's administrator binds the shipped trainjob-dispatcher-reader-job-viewer
    in the namespace (before that: 502 naming it)."""
    import base64
    import ssl

    from clusters.controlplane import free_port
    from clusters.pki import FRONT_PROXY_CLIENT, cert_pem, key_pem
    from dispatcher.remote_view import GROUP_VERSION, SERVICE, TRAINJOB_LABEL

    env, ns = kueue_env, kueue_namespace
    for cluster in env.multicluster:
        fixtures.install_runtime(cluster.api, _claiming_runtime(ns))
    objects = kustomize.render("manager-kueue")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    home = deployment["metadata"]["namespace"]
    account = (home, deployment["spec"]["template"]["spec"]["serviceAccountName"])
    # The remote view's RBAC, not its APIService: the test asks the dispatcher directly.
    rbac = [o for o in objects + kustomize.render("remote-api") if o["kind"] in IDENTITY_KINDS]
    kustomize.apply(env.manager.kubeconfig, rbac)
    user, groups = service_account_user(*account)
    kubeconfig = env.multicluster.harness.issue_user_kubeconfig(
        "manager", user, groups, tmp_path / "dispatcher.kubeconfig")
    shipped = [arg.replace("$(POD_NAMESPACE)", home)
               for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:]
               if not arg.startswith(("--metrics-", "--dashboard-", "--health-", "--log-format"))]
    port = free_port()
    dispatcher = ServiceProcess(
        "dispatcher", kubeconfig, env.log_dir / "kueue-worker-events.log",
        (*shipped, "--multikueue-config", CONFIG, "--log-level", "debug",
         "--remote-api-port", str(port), "--remote-api-host", "127.0.0.1")).start()
    try:
        body = queued_trainjob("stuck")
        body["spec"]["runtimeRef"] = {"name": UNSCHEDULABLE, "kind": c.TRAININGRUNTIME_KIND}
        env.manager.custom.create_namespaced_custom_object(*TRAINER, ns, c.TRAINJOBS, body)
        said = eventually(lambda: nominations(env, ns), lambda seen: len(seen) == 1,
                          timeout=60, expected="one Nominated Event from the dispatcher")
        nominated = said[0].rsplit(" ", 1)[-1]
        worker = env.multicluster[nominated]
        [pod] = eventually(
            lambda: [p.metadata.name for p in worker.core.list_namespaced_pod(
                ns, label_selector=f"{c.JOBSET_NAME_LABEL}=stuck").items
                if p.metadata.name.startswith(f"stuck-{c.NODE}-")],
            lambda pods: len(pods) == 1, timeout=60,
            expected=f"the trainer Pod of Kueue's copy on {nominated}")
        prefix = f"{nominated}: Pod {pod}: "
        [(message, _, source)] = eventually(
            lambda: _job_events(env, ns, "stuck", "FailedScheduling"), bool, timeout=60,
            expected=f"a FailedScheduling Event on the manager's TrainJob naming {nominated} "
                     f"and Pod {pod}")
        assert message.startswith(prefix) and source == "trainjob-dispatcher", (message, source)
        assert f'persistentvolumeclaim "{MISSING_CLAIM}" not found' in message, message

        # The scheduler tries an unschedulable Pod again when a Node comes: a Node added
        # and removed until it has said the same more than once.
        added = 0

        def repeated() -> dict[str, int]:
            nonlocal added
            said = _scheduler_said(worker, ns, pod)
            if max(said.values(), default=0) >= 2 or added >= 6:
                return said
            node = f"{ns}-retry-{added}"[:63]
            added += 1
            fixtures.add_node(worker.api, node, {"cpu": "1", "memory": "1Gi", "pods": "10"})
            try:
                eventually(lambda: sum(_scheduler_said(worker, ns, pod).values()),
                           lambda total: total > sum(said.values()), timeout=60,
                           expected=f"{nominated}'s scheduler to try Pod {pod} again on "
                                    f"Node {node}")
            finally:
                fixtures.remove_node(worker.api, node)
            return _scheduler_said(worker, ns, pod)

        said = eventually(repeated, lambda seen: max(seen.values(), default=0) >= 2,
                          timeout=300, interval=0.5,
                          expected=f"{nominated}'s scheduler to say the same about {pod} "
                                   "more than once")

        def shown() -> dict[str, list[int]]:
            counts: dict[str, list[int]] = {}
            for text, count, _ in _job_events(env, ns, "stuck", "FailedScheduling"):
                counts.setdefault(text.removeprefix(prefix), []).append(count)
            return counts

        wanted = {text: [times] for text, times in said.items()}
        eventually(shown, lambda seen: seen == wanted, timeout=60,
                   expected=f"one manager Event per FailedScheduling message, counted as "
                            f"the worker said each: {wanted}")
        holds_for(shown, lambda seen: seen == wanted, seconds=3,
                  expected=f"no other manager Event of the same message: {wanted}")

        # The remote view of Kueue's copy, read on the worker as the reader identity.
        secret = env.manager.core.read_namespaced_secret(f"{SERVICE}-cert", home)
        context = ssl.create_default_context(
            cadata=base64.b64decode(secret.data["ca.crt"]).decode())
        context.check_hostname = False  # its name is the Service's, reached on 127.0.0.1
        key, cert = env.manager.control_plane.pki.front_proxy_authority().issue(
            FRONT_PROXY_CLIENT, client=True)
        (tmp_path / "fp.crt").write_bytes(cert_pem(cert))
        (tmp_path / "fp.key").write_bytes(key_pem(key))
        context.load_cert_chain(tmp_path / "fp.crt", tmp_path / "fp.key")
        base = f"/apis/{GROUP_VERSION}/namespaces/{ns}"
        code, listed = _remote_view_get(
            port, context, f"{base}/trainjobevents?labelSelector={TRAINJOB_LABEL}%3Dstuck")
        assert code == 200 and any(
            e["worker"] == nominated and e["reason"] == "FailedScheduling"
            for e in listed.get("items") or []), (
            f"expected the worker's FailedScheduling among the copy's Events through the "
            f"remote view; got {code}: {listed}")
        log_path = f"{base}/trainjobpods/{pod}/log"
        code, refused = _remote_view_get(port, context, log_path)
        assert code == 502 and "trainjob-dispatcher-reader-job-viewer" in str(refused), (
            f"expected 502 naming the role to bind before the log is opened to the reader; "
            f"got {code}: {refused}")
        binding = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="trainjob-dispatcher-reader-job-viewer"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                      kind="ClusterRole",
                                      name="trainjob-dispatcher-reader-job-viewer"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount",
                                           name=kueue_queues.WORKER_READER_ACCOUNT[1],
                                           namespace=kueue_queues.WORKER_READER_ACCOUNT[0])])
        client.RbacAuthorizationV1Api(worker.api).create_namespaced_role_binding(ns, binding)
        # The worker's own answer now: an empty log (the Pod is on no Node yet).
        code, answered = eventually(
            lambda: _remote_view_get(port, context, log_path), lambda got: got[0] != 502,
            timeout=30, expected="the worker to let the reader ask for the Pod's log")
        assert code == 200 and answered == "", (code, answered)

        # Refused nothing else, on the manager or a worker (the log above was the test's).
        refused_lines = [line for line in
                         dispatcher.log_file.read_text(errors="replace").splitlines()
                         if "forbidden" in line.lower() and '" cannot ' in line
                         and 'cannot get resource "pods/log"' not in line]
        assert not refused_lines, "the dispatcher was refused by RBAC:\n" + "\n".join(
            refused_lines[:10])
    finally:
        dispatcher.stop()
        doomed = [o for o in rbac if o["kind"] != "Namespace"]
        kustomize.kubectl(env.manager.kubeconfig, "delete", "--ignore-not-found",
                          "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(doomed))
