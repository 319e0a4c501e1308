"""One conformance run: upstream's trainer-controller-manager on one worker (serving upstream's
CRDs), this operator on another (serving the project's), the same objects applied to both,
and what each made read back for ``compare``.

Everything the run adds (a namespace, a kwok Node per worker, the cases' cluster runtimes,
webhook configurations, the two controllers) is removed afterwards, and the upstream worker
serves the CRDs it served before.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import crds, fixtures, upstream_trainer
from clusters.conformance import compare, refusal, updates
from clusters.conformance.cases import Case
from clusters.controlplane import free_port
from clusters.local import BIND_ADDRESS, LocalClusters
from clusters.testing import ServiceProcess, eventually
from clusters.trainer_controller import TrainerController, require_alive
from clusters.worker_stack import install_webhook_configurations
from controller_kit.kubeclient import api_client
from trainjob import constants as c

log = logging.getLogger(__name__)

UPSTREAM = "upstream"
OPERATOR = "operator"
SIDES = (UPSTREAM, OPERATOR)
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)
NODE_CAPACITY = {"cpu": "512", "memory": "2Ti", "nvidia.com/gpu": "128", "pods": "1000"}
# Labels the examples' runtime patches select nodes by, so their pods run too.
NODE_LABELS = {"node-type": "training", "pool": "a"}
OPERATOR_WEBHOOK = "validating-webhook.yaml"
# How long jobs may take to finish; those with unschedulable pods, without a JobSet or
# without pods stop being waited for sooner (``wait_settled``).
SETTLE_SECONDS = 90
NO_JOBSET_GRACE = 8


@dataclass
class Row:
    """One line of the table: a case's object, equal or not, and where they differ."""

    case: str
    label: str
    paths: list[str]
    upstream: Any = None
    operator: Any = None
    # Why the differences are on purpose (the case's documented reason), or "".
    intended: str = ""

    @property
    def equal(self) -> bool:
        return not self.paths

    @property
    def unexplained(self) -> list[str]:
        """The differing paths no documented reason explains."""
        return [] if self.intended else self.paths


@dataclass
class Side:
    name: str
    cluster: str
    api: client.ApiClient
    admission: dict[str, Any] = field(default_factory=dict)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


def _refusal(err: ApiException) -> dict[str, Any]:
    """The refusal's meaning (fields and reason kinds, compared) with its wording (shown)."""
    try:
        body = json.loads(err.body or "{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict) or not body.get("message"):
        body = {**(body if isinstance(body, dict) else {}), "message": str(err.reason)}
    return refusal.answer(body, err.status)


def _create(side: Side, obj: dict, namespace: str) -> dict[str, Any]:
    kind = obj["kind"]
    plural = {c.TRAINJOB_KIND: c.TRAINJOBS, c.TRAININGRUNTIME_KIND: c.TRAININGRUNTIMES,
              c.CLUSTERTRAININGRUNTIME_KIND: c.CLUSTERTRAININGRUNTIMES}[kind]
    if kind == c.CLUSTERTRAININGRUNTIME_KIND:
        return updates.answer(lambda: side.custom.create_cluster_custom_object(
            *TRAINER, plural, obj), _refusal, exists_ok=True)
    return updates.answer(lambda: side.custom.create_namespaced_custom_object(
        *TRAINER, namespace, plural, obj), _refusal, exists_ok=True)


def apply_cases(side: Side, cases: list[Case], namespace: str) -> None:
    """Every runtime once (by kind and name), then every TrainJob, then the cases' updates;
    admission answers are kept by the object's label."""
    seen: set[tuple[str, str]] = set()
    for case in cases:
        for runtime in case.runtimes:
            key = (runtime["kind"], runtime["metadata"]["name"])
            if key in seen:
                continue
            seen.add(key)
            side.admission[f"admission {key[0]} {key[1]}"] = _create(side, runtime, namespace)
    for case in cases:
        if case.job is not None:
            side.admission[f"admission {case.name}"] = _create(side, case.job, namespace)
    # After every create, so a case waiting for its JobSet to be active holds up no other.
    side.admission.update(updates.apply_updates(
        side.custom, namespace, cases,
        lambda case: side.admission[f"admission {case.name}"].get("allowed"), _refusal))


def _trainjob(side: Side, namespace: str, name: str) -> dict | None:
    return updates.read_or_none(side.custom.get_namespaced_custom_object, *TRAINER, namespace,
                                c.TRAINJOBS, name)


def _jobset(side: Side, namespace: str, name: str) -> dict | None:
    return updates.read_or_none(side.custom.get_namespaced_custom_object, *JOBSET, namespace,
                                c.JOBSETS, name)


def _condition_true(job: dict, type_: str) -> bool:
    return any(x.get("type") == type_ and x.get("status") == "True"
               for x in (job.get("status") or {}).get("conditions") or [])


def _pods_by_jobset(side: Side, namespace: str) -> tuple[set[str], set[str]]:
    """(JobSets with any pod, JobSets with a pod the scheduler cannot place, say for want
    of a volume: those never finish)."""
    with_pods, stuck = set(), set()
    for pod in side.core.list_namespaced_pod(namespace).items:
        jobset = (pod.metadata.labels or {}).get(c.JOBSET_NAME_LABEL)
        with_pods.add(jobset)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                stuck.add(jobset)
    return with_pods, stuck


def _unsettled(side: Side, namespace: str, names: list[str]) -> tuple[list[str], list[str]]:
    """(jobs running towards an end, jobs that may never start: no JobSet yet, or a JobSet
    without any pod, as when its Jobs cannot create them)."""
    with_pods, stuck = _pods_by_jobset(side, namespace)
    running, idle = [], []
    for name in names:
        job = _trainjob(side, namespace, name)
        if job is None:
            continue
        if any(_condition_true(job, type_) for type_ in c.FINISHED_CONDITIONS):
            continue
        if job["spec"].get("suspend") or name in stuck:
            continue
        if _jobset(side, namespace, name) is None or name not in with_pods:
            idle.append(name)
        else:
            running.append(name)
    return running, idle


def wait_settled(sides: list[Side], namespace: str, names: list[str],
                 timeout: float = SETTLE_SECONDS) -> None:
    """Until every admitted job on both sides has finished, is suspended or cannot be
    scheduled, and those that have not started (no JobSet, or no pod) have stayed so for
    ``NO_JOBSET_GRACE`` seconds after the rest settled."""
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        running, idle = [], []
        for side in sides:
            r, i = _unsettled(side, namespace, names)
            running += r
            idle += i
        if not running and not idle:
            return
        if not running:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= NO_JOBSET_GRACE:
                return
        else:
            quiet_since = None
        time.sleep(0.5)
    log.warning("jobs still running after %.0fs: %s; not started: %s", timeout,
                sorted(set(running)), sorted(set(idle)))


def _owned_by(obj: Any, job: str) -> bool:
    refs = obj.metadata.owner_references or []
    return any(ref.kind == c.TRAINJOB_KIND and ref.name == job for ref in refs)


def _podgroups(side: Side, namespace: str, name: str) -> dict[str, dict | None]:
    found = {}
    for group, version, label in (("scheduling.x-k8s.io", "v1alpha1", "PodGroup coscheduling"),
                                  ("scheduling.volcano.sh", "v1beta1", "PodGroup volcano")):
        try:
            found[label] = side.custom.get_namespaced_custom_object(
                group, version, namespace, "podgroups", name)
        except ApiException as err:
            if err.status != 404:
                raise
    return found


def snapshot(side: Side, namespace: str, case: Case) -> dict[str, Any]:
    """What ``side`` made for ``case``: labelled objects, None where nothing exists."""
    shot: dict[str, Any] = {k: v for k, v in side.admission.items()
                            if k in (f"admission {case.name}", updates.label(case)) or any(
                                k == f"admission {r['kind']} {r['metadata']['name']}"
                                for r in case.runtimes)}
    if case.job is None:
        return shot
    name = case.name
    job = _trainjob(side, namespace, name)
    shot[compare.STATUS] = (job or {}).get("status") if job else None
    shot["JobSet"] = _jobset(side, namespace, name)
    api = side.api
    for kind, items in (("Secret", side.core.list_namespaced_secret(namespace).items),
                        ("ConfigMap", side.core.list_namespaced_config_map(namespace).items)):
        for item in items:
            if _owned_by(item, name):
                label = f"{kind} {item.metadata.name.replace(name, '<job>', 1)}"
                shot[label] = api.sanitize_for_serialization(item)
    shot.update(_podgroups(side, namespace, name))
    return shot


def compare_case(case: Case, upstream: dict[str, Any], operator: dict[str, Any]) -> list[Row]:
    rows = []
    for label in list(dict.fromkeys([*upstream, *operator])):
        left = upstream.get(label)
        right = operator.get(label)
        if updates.is_answer(label):
            # Equal when both admit, or both refuse naming the same fields for the same
            # reasons; the wording and the HTTP code may differ.
            paths = refusal.differences(compare.refusal_as_operator_says(left, right), right)
        else:
            left, right = compare.normalise(label, left), compare.normalise(label, right)
            if (left is None) == (right is None):
                paths = compare.differing_paths(left, right)
            else:
                paths = [f"(made by {UPSTREAM if right is None else OPERATOR} only)"]
        explained = bool(paths) and bool(case.intended) and (
            not case.intended_objects or label in case.intended_objects)
        rows.append(Row(case.name, label, paths, left, right,
                        case.intended if explained else ""))
    return rows


def _operator_webhooks(url: str, ca: bytes, namespace: str) -> list[dict]:
    """The project's TrainJob webhook configuration as shipped, calling ``url`` and limited
    to the run's namespace (other tests' namespaces on a shared cluster are not ours)."""
    from clusters.crds import manifests_dir

    documents = [d for d in yaml.safe_load_all(
        (manifests_dir() / "operator" / OPERATOR_WEBHOOK).read_text()) if d]
    for document in documents:
        document["metadata"]["name"] += "-conformance"
        document["metadata"].pop("annotations", None)
        for webhook in document["webhooks"]:
            path = webhook["clientConfig"]["service"].get("path", "")
            webhook["clientConfig"] = {"url": url + path,
                                       "caBundle": base64.b64encode(ca).decode()}
            if webhook["rules"][0].get("scope") != "Cluster":
                webhook["namespaceSelector"] = {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace}}
    return documents


def _delete_webhooks(api: client.ApiClient, documents: list[dict]) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    for document in documents:
        try:
            admission.delete_validating_webhook_configuration(document["metadata"]["name"])
        except ApiException as err:
            if err.status != 404:
                raise


def run(harness: LocalClusters, operator_cluster: str, upstream_cluster: str,
        cases: list[Case], work_dir: Path, operator_crds: str = crds.PROJECT) -> list[Row]:
    """Apply ``cases`` to both controllers and compare what they made; the table's rows.
    ``operator_crds``: the Trainer CRDs this operator's cluster serves meanwhile (the
    project's, or upstream's as a cluster that runs Trainer today has them)."""
    namespace = f"conformance-{secrets.token_hex(3)}"
    node = f"{namespace}-node"
    previous = harness.use_trainer_crds(upstream_cluster, crds.UPSTREAM)
    previous_ours = harness.use_trainer_crds(operator_cluster, operator_crds)
    sides = [Side(UPSTREAM, upstream_cluster, api_client(harness.kubeconfig(upstream_cluster))),
             Side(OPERATOR, operator_cluster, api_client(harness.kubeconfig(operator_cluster)))]
    cleanups = []
    try:
        for side in sides:
            fixtures.ensure_namespace(side.api, namespace)
            cleanups.append(lambda side=side: _delete_namespace(side, namespace))
            fixtures.add_node(side.api, node, NODE_CAPACITY, labels=NODE_LABELS)
            cleanups.append(lambda side=side: fixtures.remove_node(side.api, node))
        upstream, ours = sides
        # The coscheduling and Volcano PodGroup CRDs on both, before the controllers start
        # (upstream's looks for them once, at start).
        podgroup_crds = upstream_trainer.coscheduling_crds() + upstream_trainer.volcano_crds()
        for side in sides:
            added = _install_missing_crds(side.api, podgroup_crds)
            cleanups.append(lambda side=side, added=added: _delete_crds(side.api, added))
        trainer = TrainerController(harness, upstream_cluster).start()
        cleanups.append(trainer.stop)
        # Runs before the controllers stop: upstream's puts finalizers on the runtimes it
        # uses and must be there to take them off, or the namespace never goes.
        cleanups.append(lambda: _remove_namespace(sides, namespace))

        cert_dir = work_dir / "operator-webhook"
        ca = harness.issue_serving_certificate(operator_cluster, cert_dir)
        webhook_port = free_port(BIND_ADDRESS)
        operator = ServiceProcess("training_operator", harness.kubeconfig(operator_cluster),
                                  work_dir / "training-operator.log",
                                  ("--namespace", namespace, "--webhook-cert-dir", str(cert_dir),
                                   "--webhook-port", str(webhook_port))).start()
        cleanups.append(operator.stop)
        webhooks = _operator_webhooks(f"https://{BIND_ADDRESS}:{webhook_port}", ca.read_bytes(),
                                      namespace)
        install_webhook_configurations(ours.api, webhooks)
        cleanups.append(lambda: _delete_webhooks(ours.api, webhooks))
        _wait_webhooks_enforced(sides, namespace)
        log.info("both controllers serve; applying %d cases", len(cases))

        priorities = sorted({name for case in cases for name in case.priority_classes})
        for side in sides:
            added = _add_priority_classes(side, priorities)
            cleanups.append(lambda side=side, added=added: _delete_priority_classes(side, added))
        cluster_runtimes = {r["metadata"]["name"] for case in cases for r in case.runtimes
                            if r["kind"] == c.CLUSTERTRAININGRUNTIME_KIND}
        cleanups.append(lambda: [_delete_cluster_runtime(s, n) for s in sides
                                 for n in cluster_runtimes])
        with ThreadPoolExecutor(len(sides)) as pool:
            list(pool.map(lambda side: apply_cases(side, cases, namespace), sides))
        names = [case.name for case in cases if case.job is not None]
        log.info("applied; waiting for the jobs to settle")
        wait_settled(sides, namespace, names)
        log.info("settled; comparing")
        require_alive(trainer)
        rows = []
        for case in cases:
            rows += compare_case(case, snapshot(upstream, namespace, case),
                                 snapshot(ours, namespace, case))
        return rows
    finally:
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Exception as err:  # noqa: BLE001 - the rest of the cleanup still runs
                log.warning("conformance cleanup: %s", err)
        harness.use_trainer_crds(upstream_cluster, previous)
        harness.use_trainer_crds(operator_cluster, previous_ours)
        for side in sides:
            side.api.close()


def _delete_namespace(side: Side, namespace: str, pods_now: bool = False) -> None:
    """Delete ``namespace``; ``pods_now``: its pods too, without a grace period. The
    namespace controller waits out each pod's grace period before it looks again; kwok's
    pods have nothing to stop (and nothing new is created in a terminating namespace)."""
    try:
        side.core.delete_namespace(namespace)
        if pods_now:
            side.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    except ApiException as err:
        if err.status != 404:
            raise


def _remove_namespace(sides: list[Side], namespace: str, timeout: float = 90) -> None:
    """Delete the run's namespace on both sides and wait until it is gone, so no other
    test on these shared clusters finds it terminating."""
    for side in sides:
        _delete_namespace(side, namespace, pods_now=True)
    for side in sides:
        eventually(lambda side=side: [n.metadata.name for n in side.core.list_namespace().items],
                   lambda names: namespace not in names, timeout=timeout, interval=0.5,
                   expected=f"namespace {namespace} gone from {side.cluster}")


def _install_missing_crds(api: client.ApiClient, documents: list[dict]) -> list[str]:
    """Install the CRDs of ``documents`` the cluster lacks; the names of those installed."""
    extensions = client.ApiextensionsV1Api(api)
    present = {crd.metadata.name for crd in extensions.list_custom_resource_definition().items}
    missing = [d for d in documents if d["metadata"]["name"] not in present]
    if missing:
        crds.install_crds(api, missing, 60)
    return [d["metadata"]["name"] for d in missing]


def _delete_crds(api: client.ApiClient, names: list[str]) -> None:
    for name in names:
        try:
            client.ApiextensionsV1Api(api).delete_custom_resource_definition(name)
        except ApiException as err:
            if err.status != 404:
                raise


def _add_priority_classes(side: Side, names: list[str]) -> list[str]:
    """Create the PriorityClasses ``names`` the cluster lacks; the names of those created
    (only those are removed afterwards)."""
    scheduling = client.SchedulingV1Api(side.api)
    added = []
    for name in names:
        try:
            scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1",
                                              "kind": "PriorityClass",
                                              "metadata": {"name": name}, "value": 1000})
            added.append(name)
        except ApiException as err:
            if err.status != 409:
                raise
    return added


def _delete_priority_classes(side: Side, names: list[str]) -> None:
    for name in names:
        try:
            client.SchedulingV1Api(side.api).delete_priority_class(name)
        except ApiException as err:
            if err.status != 404:
                raise


def _delete_cluster_runtime(side: Side, name: str) -> None:
    try:
        side.custom.delete_cluster_custom_object(*TRAINER, c.CLUSTERTRAININGRUNTIMES, name)
    except ApiException as err:
        if err.status != 404:
            raise


def _wait_webhooks_enforced(sides: list[Side], namespace: str, timeout: float = 30) -> None:
    """Until both webhooks refuse a TrainJob with an unknown managedBy... through the CRD
    that could be the schema; a runtimeRef-less probe with a reserved name is refused only
    by a webhook."""
    probe = {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
             "metadata": {"generateName": "probe-"},
             "spec": {"runtimeRef": {"name": "conformance-probe-no-such-runtime"},
                      "trainer": {"env": [{"name": "PET_NNODES", "value": "1"}]}}}
    deadline = time.monotonic() + timeout
    for side in sides:
        while True:
            answer = _create(side, copy.deepcopy(probe), namespace)
            if not answer["allowed"]:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{side.cluster}: the {side.name} webhook does not refuse a "
                                   f"TrainJob after {timeout:.0f}s")
            time.sleep(0.2)
