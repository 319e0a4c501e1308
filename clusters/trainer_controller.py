"""Upstream Kubeflow Trainer's controller (trainer-controller-manager) run against one harness
cluster, the way its release installs it but on loopback: its admission webhooks served on a
local port with the cluster's serving certificate and registered by URL, its own certificate
management (which needs a Service and a Secret in the cluster) turned off, no leader election.

The webhook configurations are upstream's own manifests from the Trainer module with its
kustomize patches applied; only ``clientConfig`` changes (a URL instead of a Service).
The cluster should serve upstream's CRDs (``LocalClusters.use_trainer_crds``).
"""

from __future__ import annotations

import base64
import copy
import shutil
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import binaries as provisioning
from clusters import processes, upstream_trainer, worker_stack
from clusters.controlplane import ControlPlaneError, free_port, wait_until
from clusters.local import BIND_ADDRESS, LocalClusters

COMPONENT = upstream_trainer.COMPONENT
WEBHOOKS = "manifests/base/webhook/manifests.yaml"
WEBHOOK_PATCHES = {
    "MutatingWebhookConfiguration": "manifests/base/webhook/patch_mutating.yaml",
    "ValidatingWebhookConfiguration": "manifests/base/webhook/patch_validating.yaml",
}
CONFIG_API_VERSION = "config.trainer.kubeflow.org/v1alpha1"
# controller-runtime looks for tls.crt/tls.key here under the temporary directory; the
# Trainer Configuration has no field for it, so TMPDIR points the process at ours.
CERT_SUBDIR = "k8s-webhook-server/serving-certs"


def webhook_configurations(url_base: str, ca_bundle: bytes) -> list[dict]:
    """Upstream's webhook configurations, patched as its kustomization does, calling
    ``url_base`` + each webhook's path."""
    module = upstream_trainer.module_dir()
    documents = [d for d in yaml.safe_load_all((module / WEBHOOKS).read_text()) if d]
    configured = []
    for document in documents:
        document = copy.deepcopy(document)
        for operation in yaml.safe_load((module / WEBHOOK_PATCHES[document["kind"]])
                                        .read_text()) or []:
            worker_stack.apply_json_patch(document, operation)
        for webhook in document["webhooks"]:
            path = webhook["clientConfig"]["service"].get("path", "")
            webhook["clientConfig"] = {"url": url_base + path,
                                       "caBundle": base64.b64encode(ca_bundle).decode()}
        configured.append(document)
    return configured


class TrainerController:
    """trainer-controller-manager for harness cluster ``cluster``; ``start``/``stop``, or use
    as a context manager. Its files and log live in ``<cluster dir>/trainer-controller``."""

    def __init__(self, harness: LocalClusters, cluster: str, tied_to_caller: bool = True):
        self.harness = harness
        self.cluster = cluster
        self.tied_to_caller = tied_to_caller
        self.directory = harness.state_dir / cluster / "trainer-controller"
        self.log_file = self.directory / "trainer-controller-manager.log"
        self.webhook_port = free_port(BIND_ADDRESS)
        self.health_port = free_port(BIND_ADDRESS)
        self.pid: int | None = None
        self._installed: list[dict] = []

    def _write_config(self) -> Path:
        certs = self.directory / "tmp" / CERT_SUBDIR
        ca = self.harness.issue_serving_certificate(self.cluster, certs)
        shutil.copyfile(ca, self.directory / "ca.crt")
        path = self.directory / "config.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": CONFIG_API_VERSION, "kind": "Configuration",
            "webhook": {"port": self.webhook_port, "host": BIND_ADDRESS},
            "health": {"healthProbeBindAddress": f"{BIND_ADDRESS}:{self.health_port}"},
            # Its metrics endpoint wants certificates of its own; nothing here scrapes it.
            "metrics": {"bindAddress": "0"},
            "leaderElection": {"leaderElect": False},
            "certManagement": {"enable": False},
            "clientConnection": {"qps": 500, "burst": 1000},
        }, sort_keys=False))
        return path

    def start(self, timeout: float = 60) -> TrainerController:
        binary = provisioning.find_binaries(build=True, names=[COMPONENT]).paths[COMPONENT]
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        kubeconfig = self.harness.kubeconfig(self.cluster)
        self.pid = processes.spawn(
            [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}"],
            self.log_file, tied_to_parent=self.tied_to_caller,
            env={"TMPDIR": str(self.directory / "tmp")})
        wait_until(f"{self.cluster} trainer-controller-manager",
                   lambda: worker_stack.http_ok(BIND_ADDRESS, self.health_port, "/readyz"),
                   timeout, alive=lambda: processes.is_alive(self.pid), log_file=self.log_file)
        self._installed = webhook_configurations(f"https://{BIND_ADDRESS}:{self.webhook_port}",
                                                 (self.directory / "ca.crt").read_bytes())
        with self._api() as api:
            worker_stack.install_webhook_configurations(api, self._installed)
        return self

    def stop(self) -> None:
        """Remove its webhook configurations (nothing may call a stopped server), then stop it."""
        with self._api() as api:
            admission = client.AdmissionregistrationV1Api(api)
            for document in self._installed:
                delete = (admission.delete_mutating_webhook_configuration
                          if document["kind"] == "MutatingWebhookConfiguration"
                          else admission.delete_validating_webhook_configuration)
                try:
                    delete(document["metadata"]["name"])
                except ApiException as err:
                    if err.status != 404:
                        raise
        self._installed = []
        if self.pid:
            processes.terminate(self.pid, self.harness.state_dir)
            self.pid = None

    def _api(self):
        from controller_kit.kubeclient import api_client

        return api_client(self.harness.kubeconfig(self.cluster))

    def __enter__(self) -> TrainerController:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def require_alive(controller: TrainerController) -> None:
    """Fail with the log tail when the controller has exited."""
    if not processes.is_alive(controller.pid):
        raise ControlPlaneError(f"trainer-controller-manager exited. Log tail:\n"
                                f"{processes.log_tail(controller.log_file)}")
