"""The project's images as users run them: built by `python -m clusters images` from this
working tree, each container started by the Docker engine against the harness's real
clusters (host network, kubeconfigs mounted read-only).

* each image answers --help and stays under its size budget;
* the dispatcher container claims a TrainJob on the manager and copies it to a worker;
* the operator container serves its admission webhook to a worker's apiserver over TLS.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, images
from clusters.controlplane import free_port
from clusters.testing import eventually
from training_operator.webhook_server import VALIDATE_PATH
from trainjob import constants as c

IMAGE_BUDGET_BYTES = 250 * 1000 * 1000
CONFIG = "containers"
WEBHOOK = "validate.trainjobs.trainer.kubeflow.org"


def readable_copy(source: Path, directory: Path) -> Path:
    """The images run as user 65532: hand it a copy of a kubeconfig it may read."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    target = directory / source.name
    shutil.copyfile(source, target)
    target.chmod(0o644)
    return target


class Container:
    """A detached container on the host network, removed by ``remove``."""

    def __init__(self, engine, name: str, argv: list[str]):
        self.engine = engine
        self.name = name
        engine.docker("run", "-d", "--name", name, "--network", "host", *argv)

    def logs(self) -> str:
        result = self.engine.docker("logs", "--tail", "40", self.name, check=False)
        return (result.stdout + result.stderr).decode(errors="replace")

    def running(self) -> bool:
        result = self.engine.docker("inspect", "--format", "{{.State.Running}}", self.name,
                                    check=False)
        if result.stdout.strip() != b"true":
            raise AssertionError(f"container {self.name} is not running:\n{self.logs()}")
        return True

    def remove(self) -> None:
        self.engine.docker("rm", "-f", self.name, check=False)


def http_status(port: int, path: str) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("image", [images.DISPATCHER_IMAGE, images.OPERATOR_IMAGE])
def test_image_answers_help_and_fits_its_budget(docker_engine, project_images, image):
    result = docker_engine.docker("run", "--rm", image, "--help", check=False)
    assert result.returncode == 0, (
        f"`docker run --rm {image} --help` exited {result.returncode}: {result.stderr!r}")
    assert b"usage:" in result.stdout, f"{image} --help printed {result.stdout[:400]!r}"
    user = docker_engine.docker("image", "inspect", "--format", "{{.Config.User}}", image)
    assert user.stdout.strip() == b"65532:65532", (
        f"{image} must run as the unprivileged user 65532, runs as {user.stdout!r}")
    size = images.image_size(docker_engine, image)
    assert size < IMAGE_BUDGET_BYTES, f"{image} weighs {size / 1e6:.0f} MB, budget 250 MB"


def test_no_image_layer_holds_the_ca_bundle(docker_engine, project_images):
    """pip's CA bundle is a build secret: mounted for the install steps, never in a layer."""
    for image in (images.DISPATCHER_IMAGE, images.OPERATOR_IMAGE):
        history = docker_engine.docker("history", "--no-trunc", "--format", "{{.CreatedBy}}",
                                       image).stdout.decode()
        assert "ca-certificates.crt" not in history, (
            f"{image}'s history names the host's CA bundle:\n{history}")
        listing = docker_engine.docker(
            "run", "--rm", "--entrypoint", "python", image, "-c",
            "import os; print([p for p in ('/run/secrets/ca', '/src') if os.path.exists(p)])")
        assert listing.stdout.strip() == b"[]", (
            f"{image} keeps build-time files: {listing.stdout!r}")


def test_workload_image_runs_for_its_time_and_exits_with_its_code(docker_engine,
                                                                   project_images):
    result = docker_engine.docker("run", "--rm", images.WORKLOAD_IMAGE, "--run-for", "1s",
                                  "--exit-code", "3", check=False)
    assert result.returncode == 3, (
        f"the workload should exit 3 after 1 s; exit {result.returncode}, "
        f"output {result.stdout!r} {result.stderr!r}")
    ran = re.search(rb"done after ([0-9.]+)(ms|s)", result.stdout)
    assert ran, result.stdout
    seconds = float(ran.group(1)) / (1000 if ran.group(2) == b"ms" else 1)
    assert seconds >= 1.0, f"the workload should run at least 1 s: {result.stdout!r}"


@pytest.fixture
def registered_worker(multicluster):
    """worker-1 registered on the manager, with room for a job and the test runtime."""
    manager, worker = multicluster.manager, multicluster["worker-1"]
    node = f"containers-{secrets.token_hex(3)}"
    fixtures.register_worker(manager.api, "worker-1", worker.kubeconfig)
    fixtures.register_config(manager.api, CONFIG, ["worker-1"])
    fixtures.add_node(worker.api, node, {"cpu": "16", "memory": "64Gi", "pods": "110"})
    fixtures.install_runtime(worker.api, fixtures.torch_runtime("containers-runtime"))
    yield worker
    custom = client.CustomObjectsApi(manager.api)
    custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECONFIGS,
                                        CONFIG)
    custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS,
                                        "worker-1")
    client.CoreV1Api(worker.api).delete_node(node)


def test_dispatcher_container_dispatches_a_job(docker_engine, project_images, multicluster,
                                               registered_worker, namespace, tmp_path):
    manager = multicluster.manager
    kubeconfig = readable_copy(manager.kubeconfig, tmp_path / "kube")
    port = free_port()
    container = Container(docker_engine, f"dispatcher-test-{secrets.token_hex(3)}", [
        "-v", f"{kubeconfig.parent}:/kube:ro", images.DISPATCHER_IMAGE, "run",
        "--kubeconfig", f"/kube/{kubeconfig.name}", "--multikueue-config", CONFIG,
        "--metrics-host", "127.0.0.1", "--metrics-port", str(port)])
    try:
        eventually(lambda: container.running() and http_status(port, "/readyz"),
                   lambda status: status == 200, timeout=60,
                   expected=f"the dispatcher container's /readyz on port {port} to answer 200")
        custom = client.CustomObjectsApi(manager.api)
        custom.create_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION, namespace,
                                               c.TRAINJOBS, {
            "apiVersion": f"{c.TRAINER_GROUP}/{c.TRAINER_VERSION}", "kind": "TrainJob",
            "metadata": {"name": "from-a-container"},
            "spec": {"managedBy": c.MANAGED_BY_MULTIKUEUE,
                     "runtimeRef": {"name": "containers-runtime"},
                     "trainer": {"numNodes": 1,
                                 "resourcesPerNode": {"requests": {"cpu": "1"}}}}})
        worker_custom = client.CustomObjectsApi(registered_worker.api)
        copy = eventually(
            lambda: worker_custom.get_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, "from-a-container"),
            lambda obj: bool(obj), timeout=60,
            expected="the dispatcher container to copy the TrainJob to worker-1")
        assert copy["metadata"]["labels"].get(c.MULTIKUEUE_ORIGIN_LABEL), copy["metadata"]
        # Deleted while the dispatcher runs, so it releases its finalizer and the copy.
        custom.delete_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION, namespace,
                                               c.TRAINJOBS, "from-a-container")
        eventually(lambda: [j["metadata"]["name"] for j in custom.list_namespaced_custom_object(
                       c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS)["items"]],
                   lambda left: not left, timeout=60,
                   expected="the deleted TrainJob released by the dispatcher container")
    finally:
        logs = container.logs()
        container.remove()
    assert "Traceback" not in logs, logs


def test_operator_container_serves_its_webhook(docker_engine, project_images, multicluster,
                                               namespace, tmp_path):
    worker = multicluster["worker-2"]
    kube = tmp_path / "kube"
    kubeconfig = readable_copy(worker.kubeconfig, kube)
    ca = multicluster.harness.issue_serving_certificate("worker-2", kube)
    for path in kube.iterdir():
        path.chmod(0o644)
    webhook_port, metrics_port = free_port(), free_port()
    container = Container(docker_engine, f"operator-test-{secrets.token_hex(3)}", [
        "-v", f"{kube}:/kube:ro", images.OPERATOR_IMAGE, "run",
        "--kubeconfig", f"/kube/{kubeconfig.name}", "--webhook-cert-dir", "/kube",
        "--webhook-port", str(webhook_port), "--metrics-port", str(metrics_port)])
    admission = client.AdmissionregistrationV1Api(worker.api)
    configuration = f"containers-{secrets.token_hex(3)}"
    try:
        eventually(lambda: container.running() and http_status(metrics_port, "/readyz"),
                   lambda status: status == 200, timeout=60,
                   expected="the operator container's /readyz to answer 200")
        admission.create_validating_webhook_configuration({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": configuration},
            "webhooks": [{
                "name": WEBHOOK, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 5,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "clientConfig": {
                    "url": f"https://127.0.0.1:{webhook_port}{VALIDATE_PATH}",
                    "caBundle": base64.b64encode(ca.read_bytes()).decode()},
                "rules": [{"apiGroups": [c.TRAINER_GROUP], "apiVersions": [c.TRAINER_VERSION],
                           "resources": ["trainjobs"], "operations": ["CREATE"]}],
            }]})
        body = {"apiVersion": f"{c.TRAINER_GROUP}/{c.TRAINER_VERSION}", "kind": "TrainJob",
                "metadata": {"generateName": "refused-"},
                "spec": {"runtimeRef": {"name": "no-such-runtime"}}}

        def attempt() -> str:
            try:
                worker.custom.create_namespaced_custom_object(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, body)
                return "created: the webhook is not called yet"
            except ApiException as err:
                return json.loads(err.body)["message"]

        message = eventually(attempt, lambda m: f'admission webhook "{WEBHOOK}" denied' in m,
                             timeout=30, expected="the operator container's webhook to refuse "
                             "a TrainJob whose runtime does not exist")
        assert "no-such-runtime" in message, message
    finally:
        try:
            admission.delete_validating_webhook_configuration(configuration)
        except ApiException:
            pass
        logs = container.logs()
        container.remove()
    assert "Traceback" not in logs, logs
