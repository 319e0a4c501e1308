"""Objects the tests, the demo and the benchmarks put into the local clusters: worker
registration on the manager (Secret + MultiKueueCluster + MultiKueueConfig), kwok Nodes with
capacity on workers (kwok keeps them Ready, as kubelets would), and runtimes.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import nodes
from clusters.controlplane import wait_until
from controller_kit.kubeclient import apply_custom_object
from trainjob import constants as c

FIELD_MANAGER = "trainjob-clusters"


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as err:
        if err.status != 409:
            raise


# manifests/worker-access: the dispatcher's identity on a worker, and the ClusterRole a
# worker's administrator binds in each namespace the dispatcher may create TrainJobs in.
WORKER_ACCESS_ACCOUNT = ("trainjob-system", "trainjob-dispatcher")
WORKER_WRITER_ROLE = "trainjob-dispatcher-writer"
# The namespace's Pod Security level, which worker-access's policy requires of a namespace
# before it lets the dispatcher copy a TrainJob into it (at least its ConfigMap's level,
# baseline as shipped).
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")


def open_namespace_to_dispatcher(api: client.ApiClient, namespace: str,
                                 pod_security: str | None = "baseline") -> None:
    """Open ``namespace`` on a worker to the dispatcher, as its administrator does: label it
    to enforce Pod Security ``pod_security`` (``kubectl label namespace``; a stronger level
    already there stays; None leaves the label as it is, for tests of a namespace opened
    by RBAC alone) and bind the dispatcher's writer ClusterRole in it (``kubectl create
    rolebinding``; a no-op when already bound)."""
    core = client.CoreV1Api(api)
    labels = core.read_namespace(namespace).metadata.labels or {}
    current = labels.get(POD_SECURITY_ENFORCE)
    if pod_security is not None and (
            current not in POD_SECURITY_LEVELS
            or POD_SECURITY_LEVELS.index(current) < POD_SECURITY_LEVELS.index(pod_security)):
        core.patch_namespace(namespace, {"metadata": {"labels": {
            POD_SECURITY_ENFORCE: pod_security}}})
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=WORKER_WRITER_ROLE, namespace=namespace),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole",
                                  name=WORKER_WRITER_ROLE),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=WORKER_ACCESS_ACCOUNT[1],
                                       namespace=WORKER_ACCESS_ACCOUNT[0])])
    try:
        client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, binding)
    except ApiException as err:
        if err.status != 409:
            raise


def store_kubeconfig(manager: client.ApiClient, secret_name: str, kubeconfig: Path | str,
                     namespace: str) -> None:
    """The Secret ``namespace/secret_name`` holding ``kubeconfig`` under key ``kubeconfig``
    (created, or replaced when it exists)."""
    ensure_namespace(manager, namespace)
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret_name, namespace=namespace),
        data={"kubeconfig": base64.b64encode(Path(kubeconfig).read_bytes()).decode()})
    core = client.CoreV1Api(manager)
    try:
        core.create_namespaced_secret(namespace, secret)
    except ApiException as err:
        if err.status != 409:
            raise
        core.replace_namespaced_secret(secret_name, namespace, secret)


def register_worker(manager: client.ApiClient, name: str, kubeconfig: Path | str,
                    namespace: str = "kueue-system") -> None:
    """A Secret holding ``kubeconfig`` under key ``kubeconfig`` and a MultiKueueCluster
    pointing at it, as MultiKueue users set workers up."""
    store_kubeconfig(manager, f"{name}-kubeconfig", kubeconfig, namespace)
    apply_custom_object(manager, c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, {
        "apiVersion": f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", "kind": "MultiKueueCluster",
        "metadata": {"name": name},
        "spec": {"clusterSource": {"kubeConfig": {"location": f"{name}-kubeconfig",
                                                  "locationType": "Secret"}}},
    }, FIELD_MANAGER)


def register_config(manager: client.ApiClient, name: str, clusters: list[str]) -> None:
    apply_custom_object(manager, c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECONFIGS, {
        "apiVersion": f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", "kind": "MultiKueueConfig",
        "metadata": {"name": name}, "spec": {"clusters": clusters},
    }, FIELD_MANAGER)


def add_node(api: client.ApiClient, name: str, allocatable: dict[str, str],
             labels: dict[str, str] | None = None, taints: list[dict] | None = None,
             ready: bool = True, timeout: float = 30) -> None:
    """A kwok Node with ``allocatable`` capacity, registered as a kubelet would register it;
    waits until kwok has made it Ready and the node-lifecycle controller has lifted the
    not-ready taint. ``ready=False`` makes a Node no kwok manages: it never turns Ready."""
    nodes.register_node(api, name, allocatable, labels, taints, managed=ready)
    if ready:
        nodes.wait_schedulable(api, [name], timeout)


PROBE_PREFIX = "scheduler-probe-"


def wait_scheduler_sees(api: client.ApiClient, namespace: str, node: str,
                        timeout: float = 30) -> None:
    """Until kube-scheduler binds a pod to ``node``: proof that its cache has the Node as
    schedulable (the Ready Node in the API can be a moment ahead of it). The probe pod
    requests nothing, tolerates everything, and is deleted once bound."""
    core = client.CoreV1Api(api)
    name = f"{PROBE_PREFIX}{node}"[:63]
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "tolerations": [{"operator": "Exists"}], "restartPolicy": "Never",
                 "containers": [{"name": "probe", "image": "probe"}]}})
    try:
        wait_until(f"kube-scheduler binding probe pod {namespace}/{name} to Node {node}",
                   lambda: bool(core.read_namespaced_pod(name, namespace).spec.node_name),
                   timeout)
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def remove_node(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_node(name)
    except ApiException as err:
        if err.status != 404:
            raise


def torch_runtime(name: str, num_nodes: int = 1, cpu: str = "1", memory: str = "1Gi",
                  namespace: str | None = None,
                  pod_annotations: dict[str, str] | None = None,
                  node_selector: dict[str, str] | None = None,
                  initializers_first: bool = False,
                  initializer_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A ClusterTrainingRuntime (or TrainingRuntime with ``namespace``) for torch with
    dataset and model initializers and a trainer job, each pod requesting cpu/memory.
    ``initializers_first``: the trainer job waits for both initializers to complete
    (JobSet ``dependsOn``), as upstream Trainer's runtimes with initializers have it;
    without it all three start at once. ``initializer_annotations`` go on the initializers'
    pods instead of ``pod_annotations`` (e.g. a shorter run time).
    ``pod_annotations`` go on every pod (e.g. ``worker_stack.OUTCOME_ANNOTATION``, to tell
    kwok how the pods end), and so does ``node_selector``. The pods have no termination
    grace period: kwok's have nothing to stop, and the namespace controller waits out the
    longest grace period of a namespace's pods before it looks again, so a namespace holding
    them would take 30 s to go."""
    def job(job_name: str, role: str, image: str) -> dict[str, Any]:
        annotations = pod_annotations
        if initializer_annotations is not None and role in c.INITIALIZER_ROLES:
            annotations = initializer_annotations
        pod_metadata = {"annotations": dict(annotations)} if annotations else {}
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                    "containers": [{
            "name": job_name, "image": image,
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
        if node_selector:
            pod_spec["nodeSelector"] = dict(node_selector)
        return {"name": job_name, "template": {
            "metadata": {"labels": {c.ANCESTOR_LABEL: role}},
            "spec": {"template": {"metadata": pod_metadata, "spec": pod_spec}}}}

    trainer = job(c.NODE, c.ROLE_TRAINER, "pytorch/pytorch:2.5.0")
    if initializers_first:
        trainer["dependsOn"] = [{"name": c.DATASET_INITIALIZER, "status": "Complete"},
                                {"name": c.MODEL_INITIALIZER, "status": "Complete"}]
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": c.TRAINER_API_VERSION,
        "kind": c.TRAININGRUNTIME_KIND if namespace else c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": num_nodes, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": {"replicatedJobs": [
                job(c.DATASET_INITIALIZER, c.ROLE_DATASET_INITIALIZER, "dataset-initializer:v1"),
                job(c.MODEL_INITIALIZER, c.ROLE_MODEL_INITIALIZER, "model-initializer:v1"),
                trainer,
            ]}},
        },
    }


def install_runtime(api: client.ApiClient, runtime: dict[str, Any]) -> None:
    plural = (c.TRAININGRUNTIMES if runtime["kind"] == c.TRAININGRUNTIME_KIND
              else c.CLUSTERTRAININGRUNTIMES)
    apply_custom_object(api, c.TRAINER_GROUP, c.TRAINER_VERSION, plural, runtime, FIELD_MANAGER)
