"""What runs under a harness worker besides its control plane: kube-scheduler, the upstream
JobSet controller (with its CRD and admission webhooks) and kwok, which plays the kubelet for
every Node it manages.

Upstream configuration is read from each project's module in the Go module cache at start
time (JobSet's CRD and webhook manifests, kwok's node and pod Stages); only what this
project decides itself is written here: ports, certificates, and the pod Stages that make a
pod succeed, fail or run on, per the annotations below.

Pod behaviour on kwok Nodes (set these on the pod template, e.g. in a runtime):
  * default: Running as soon as it is bound, Succeeded ``DEFAULT_RUN_FOR`` later;
  * ``RUN_FOR_ANNOTATION: "30s"``: Succeeded after that long instead;
  * ``OUTCOME_ANNOTATION: "fail"``: Failed (exit code 1) after the run time;
  * ``OUTCOME_ANNOTATION: "never"``: Running until deleted.
A pod the scheduler cannot place stays Pending with the scheduler's own reason.
"""

from __future__ import annotations

import base64
import copy
import http.client
import shutil
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from clusters import binaries as provisioning
from clusters.nodes import KWOK_SELECTOR

WORKER_COMPONENTS = ("kube-scheduler", "jobset-controller", "kwok")
FIELD_MANAGER = "trainjob-clusters"

RUN_FOR_ANNOTATION = "trainjob-dispatcher.io/kwok-run-for"
OUTCOME_ANNOTATION = "trainjob-dispatcher.io/kwok-outcome"
OUTCOME_FAIL = "fail"
OUTCOME_NEVER = "never"
DEFAULT_RUN_FOR_MS = 3000
# A JobSet naming this in spec.managedBy is skipped by the real JobSet controller (JobSet's
# own delegation, the one MultiKueue uses): for tests that play the controller themselves.
JOBSET_MANAGED_BY_TEST = "trainjob-dispatcher.io/test-writes-jobset-status"

# Paths inside the upstream modules.
JOBSET_CRD = "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
JOBSET_WEBHOOKS = "config/components/webhook/manifests.yaml"
JOBSET_WEBHOOK_PATCHES = {
    "MutatingWebhookConfiguration": "config/components/webhook/patches/mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "config/components/webhook/patches/validating-patch.yaml",
}
# JobSet's kustomize overlay prefixes every name with this.
JOBSET_NAME_PREFIX = "jobset-"
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def jobset_crds() -> list[dict]:
    path = provisioning.module_dir("jobset-controller") / JOBSET_CRD
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- configuration files --------------------------------------------------------------


def write_scheduler_config(directory: Path, kubeconfig: Path) -> Path:
    path = directory / "kube-scheduler.yaml"
    _write_yaml(path, {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 500, "burst": 1000},
        "leaderElection": {"leaderElect": False},
    })
    return path


def write_jobset_config(directory: Path, serving_cert: Path, serving_key: Path,
                        webhook_port: int, health_port: int, bind_address: str) -> Path:
    """JobSet's Configuration: webhooks on loopback with the cluster's serving certificate
    (its own certificate rotation needs a Service the harness does not have)."""
    certs = directory / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(serving_cert, certs / "tls.crt")
    shutil.copyfile(serving_key, certs / "tls.key")
    (certs / "tls.key").chmod(0o600)
    path = directory / "jobset-config.yaml"
    _write_yaml(path, {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": bind_address, "certDir": str(certs)},
        # Its metrics endpoint wants certificates of its own; nothing here scrapes it.
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"{bind_address}:{health_port}"},
        "clientConnection": {"qps": 500, "burst": 1000},
    })
    return path


def write_kwok_config(directory: Path) -> Path:
    """kwok's configuration: upstream's node Stages and pod readiness/deletion, plus this
    harness's own Stages for how a running pod ends."""
    kwok = provisioning.module_dir("kwok")
    documents: list[dict] = [{
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        # kwok defaults these only when it runs without a configuration file.
        "options": {"manageNodesWithAnnotationSelector": KWOK_SELECTOR,
                    "nodeLeaseDurationSeconds": 40, "nodeLeaseParallelism": 4,
                    "podPlayStageParallelism": 8, "nodePlayStageParallelism": 4,
                    "podsOnNodeSyncParallelism": 2},
    }]
    for relative in KWOK_STAGES:
        documents += [d for d in yaml.safe_load_all((kwok / relative).read_text()) if d]
    documents += [_finish_stage("trainjob-pod-succeed", "Succeeded", 0, "Completed",
                                [OUTCOME_FAIL, OUTCOME_NEVER]),
                  _finish_stage("trainjob-pod-fail", "Failed", 1, "Error", None)]
    path = directory / "kwok.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def _finish_stage(name: str, phase: str, exit_code: int, reason: str,
                  not_outcomes: list[str] | None) -> dict:
    """A Stage that ends a running pod in ``phase`` once its run time is over."""
    outcome_key = f'.metadata.annotations["{OUTCOME_ANNOTATION}"]'
    outcome = ({"key": outcome_key, "operator": "NotIn", "values": not_outcomes}
               if not_outcomes else
               {"key": outcome_key, "operator": "In", "values": [OUTCOME_FAIL]})
    status = (
        "{{ $now := Now }}\n"
        "containerStatuses:\n"
        "{{ range .spec.containers }}\n"
        "- image: {{ .image | Quote }}\n"
        "  name: {{ .name | Quote }}\n"
        "  ready: false\n"
        "  restartCount: 0\n"
        "  started: false\n"
        "  state:\n"
        "    terminated:\n"
        f"      exitCode: {exit_code}\n"
        f"      reason: {reason}\n"
        "      startedAt: {{ $now | Quote }}\n"
        "      finishedAt: {{ $now | Quote }}\n"
        "{{ end }}\n"
        f"phase: {phase}\n"
    )
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchExpressions": [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                outcome,
            ]},
            "delay": {
                "durationMilliseconds": DEFAULT_RUN_FOR_MS,
                "durationFrom": {
                    "expressionFrom": f'.metadata.annotations["{RUN_FOR_ANNOTATION}"]'},
            },
            "next": {"statusTemplate": status},
        },
    }


# --- JobSet webhooks ------------------------------------------------------------------


def jobset_webhook_configurations(url_base: str, ca_bundle: bytes) -> list[dict]:
    """JobSet's webhook configurations as its release installs them, pointed at the
    controller's loopback address instead of a Service."""
    jobset = provisioning.module_dir("jobset-controller")
    documents = [d for d in yaml.safe_load_all((jobset / JOBSET_WEBHOOKS).read_text()) if d]
    configured = []
    for document in documents:
        document = copy.deepcopy(document)
        patch_file = JOBSET_WEBHOOK_PATCHES.get(document["kind"])
        if patch_file:
            for operation in yaml.safe_load((jobset / patch_file).read_text()) or []:
                apply_json_patch(document, operation)
        document["metadata"]["name"] = JOBSET_NAME_PREFIX + document["metadata"]["name"]
        for webhook in document.get("webhooks", []):
            path = webhook["clientConfig"]["service"].get("path", "")
            webhook["clientConfig"] = {"url": url_base + path,
                                       "caBundle": base64.b64encode(ca_bundle).decode()}
        configured.append(document)
    return configured


def apply_json_patch(document: dict, operation: dict) -> None:
    """The ``add``/``replace`` operations of an RFC 6902 patch (all that JobSet's and
    Trainer's webhook patches use)."""
    if operation.get("op") not in ("add", "replace"):
        raise ValueError(f"unsupported patch operation {operation.get('op')!r}")
    *parents, last = [p.replace("~1", "/").replace("~0", "~")
                      for p in operation["path"].lstrip("/").split("/")]
    target: Any = document
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        index = len(target) if last == "-" else int(last)
        if operation["op"] == "replace":
            target[index] = operation["value"]
        else:
            target.insert(index, operation["value"])
    else:
        target[last] = operation["value"]


def install_webhook_configurations(api: client.ApiClient, configurations: list[dict]) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    for document in configurations:
        name = document["metadata"]["name"]
        if document["kind"] == "MutatingWebhookConfiguration":
            patch = admission.patch_mutating_webhook_configuration
        else:
            patch = admission.patch_validating_webhook_configuration
        patch(name, document, field_manager=FIELD_MANAGER, force=True,
              _content_type="application/apply-patch+yaml")


# --- probes ---------------------------------------------------------------------------


def http_ok(address: str, port: int, path: str) -> bool:
    conn = http.client.HTTPConnection(address, port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _write_yaml(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))

