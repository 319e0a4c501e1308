"""The operator's own webhook certificates (``--webhook-cert-management internal``) on a
real worker: it creates the Secret, injects the CA into a ValidatingWebhookConfiguration the
test registers without one, serves the certificate (leader and standby alike) and rotates it
with no TrainJob write refused.

The configuration calls the operator by URL on 127.0.0.1 (an extra host of the certificate),
fails closed, and only for the test's own namespace (a namespaceSelector), so no other test
meets it. Each test has its own namespace, Secret, configuration and port.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import ssl

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import kustomize
from clusters.controlplane import free_port
from clusters.pki import service_account_user
from clusters.testing import ServiceProcess, eventually
from training_operator.webhook_server import VALIDATE_PATH
from trainjob import constants as c

WORKER = "worker-1"
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
WEBHOOK = "validate.trainjobs.trainer.kubeflow.org"
DENIED = f'admission webhook "{WEBHOOK}" denied the request'
SECRET = "training-operator-webhook-cert"
WRITES = "training_operator_webhook_certificate_secret_writes_total"
LOADS = "training_operator_webhook_certificate_loads_total"


@pytest.fixture
def configuration(multicluster, namespace):
    """``(name, port)``: a fail-closed TrainJob webhook for ``namespace`` only, calling
    https://127.0.0.1:<port>, with no caBundle."""
    admission = client.AdmissionregistrationV1Api(multicluster[WORKER].api)
    name, port = f"test-webhook-certs-{secrets.token_hex(3)}", free_port()
    admission.create_validating_webhook_configuration({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": WEBHOOK,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "clientConfig": {"url": f"https://127.0.0.1:{port}{VALIDATE_PATH}"},
            "rules": [{"apiGroups": [c.TRAINER_GROUP], "apiVersions": [c.TRAINER_VERSION],
                       "resources": [c.TRAINJOBS], "operations": ["CREATE", "UPDATE"],
                       "scope": "Namespaced"}],
        }],
    })
    yield name, port
    admission.delete_validating_webhook_configuration(name)


def flags(namespace: str, configuration: str, port: int, *extra: str) -> tuple[str, ...]:
    return ("--namespace", namespace, "--webhook-cert-management", "internal",
            "--webhook-cert-namespace", namespace, "--webhook-config-name", configuration,
            "--webhook-port", str(port), "--webhook-cert-extra-hosts", "127.0.0.1", *extra)


def secret_data(worker, namespace: str) -> dict[str, bytes]:
    try:
        found = worker.core.read_namespaced_secret(SECRET, namespace)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise
    return {k: base64.b64decode(v) for k, v in (found.data or {}).items()}


def ca_bundles(worker, name: str) -> list[bytes]:
    found = client.AdmissionregistrationV1Api(worker.api).read_validating_webhook_configuration(
        name)
    return [base64.b64decode(w.client_config.ca_bundle or "") for w in found.webhooks]


def trainjob(name: str, **metadata) -> dict:
    # Dispatched by MultiKueue: the webhook judges it, the operator leaves it alone.
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name, **metadata},
            "spec": {"managedBy": c.MANAGED_BY_MULTIKUEUE, "runtimeRef": {"name": "torch"}}}


def create(worker, namespace: str, body: dict, dry_run: bool = False) -> str:
    """"created", or the apiserver's message for a refusal."""
    try:
        worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, body,
                                                      **({"dry_run": "All"} if dry_run else {}))
        return "created"
    except ApiException as err:
        try:
            message = json.loads(err.body)["message"]
        except (TypeError, ValueError, KeyError):
            message = err.body
        return f"HTTP {err.status}: {message}"


def served_certificate(port: int, ca: bytes) -> bytes:
    """The certificate the operator on ``port`` presents, verified with ``ca`` for
    127.0.0.1 (as the apiserver does with the caBundle)."""
    context = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def der(pem: bytes) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def test_the_operator_makes_injects_and_serves_its_certificate(multicluster, namespace,
                                                               configuration, run_operator,
                                                               tmp_path):
    worker = multicluster[WORKER]
    name, port = configuration
    cert_dir = tmp_path / "certs"
    run_operator(worker, *flags(namespace, name, port, "--webhook-cert-dir", str(cert_dir)))

    data = secret_data(worker, namespace)  # ready: it serves what the Secret holds
    assert set(data) >= {"ca.crt", "ca.key", "tls.crt", "tls.key"}, sorted(data)
    names = x509.load_pem_x509_certificate(data["tls.crt"]).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        f"training-operator-webhook.{namespace}.svc",
        f"training-operator-webhook.{namespace}.svc.cluster.local"}
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eventually(lambda: ca_bundles(worker, name), lambda found: found == [data["ca.crt"]],
               expected=f"the caBundle of {name} set to the Secret's ca.crt")
    assert {f: (cert_dir / f).read_bytes() for f in ("tls.crt", "tls.key", "ca.crt")} == {
        f: data[f] for f in ("tls.crt", "tls.key", "ca.crt")}
    assert served_certificate(port, data["ca.crt"]) == der(data["tls.crt"])

    # The apiserver picks the caBundle up through its own watch, a moment after the write.
    eventually(lambda: create(worker, namespace, trainjob(f"valid-{secrets.token_hex(2)}")),
               lambda outcome: outcome == "created",
               expected="a valid TrainJob admitted once the apiserver trusts the CA")
    refused = create(worker, namespace, trainjob("1-not-a-dns-label"))
    assert refused.startswith("HTTP 422") and DENIED in refused, refused
    assert "metadata.name" in refused and "DNS-1035" in refused, refused


def test_only_the_leader_writes_and_both_replicas_serve(multicluster, namespace, configuration,
                                                        run_operator):
    worker = multicluster[WORKER]
    name, port = configuration
    election = ("--leader-elect", "--leader-elect-namespace", namespace, "--lease-duration",
                "3", "--renew-deadline", "2", "--retry-period", "0.5")
    first = run_operator(worker, *flags(namespace, name, port, *election))
    second_port = free_port()
    second = run_operator(worker, *flags(namespace, name, second_port, *election))

    def roles() -> dict[str, ServiceProcess]:
        return {process.readyz()[1].split()[0]: process for process in (first, second)}

    found = eventually(roles, lambda seen: set(seen) == {"leader", "standby"},
                       expected="one operator leading, the other a ready standby")
    leader, standby = found["leader"], found["standby"]
    data = secret_data(worker, namespace)
    assert leader.metric(WRITES) >= 1 and standby.metric(WRITES) == 0, (
        leader.metric(WRITES), standby.metric(WRITES))
    assert standby.metric(LOADS) >= 1
    for served_port in (port, second_port):
        assert served_certificate(served_port, data["ca.crt"]) == der(data["tls.crt"]), (
            f"the operator on port {served_port} serves the Secret's certificate")


def test_rotations_refuse_no_write(multicluster, namespace, configuration, run_operator):
    """A serving certificate of 24 s is renewed every 16 s: TrainJob creates go on through
    two rotations and every one of them is admitted."""
    worker = multicluster[WORKER]
    name, port = configuration
    operator = run_operator(worker, *flags(namespace, name, port,
                                           "--webhook-cert-validity", "24"))
    eventually(lambda: create(worker, namespace, trainjob("first")),
               lambda outcome: outcome == "created",
               expected="a TrainJob admitted once the apiserver trusts the CA")
    seen = [secret_data(worker, namespace)["tls.crt"]]
    refused: list[str] = []
    creates = 0

    def rotate_while_creating() -> tuple[int, float]:
        nonlocal creates
        outcome = create(worker, namespace, trainjob(f"job-{creates}"), dry_run=creates % 10 != 0)
        creates += 1
        if outcome != "created":
            refused.append(outcome)
        current = secret_data(worker, namespace)["tls.crt"]
        if current != seen[-1]:
            seen.append(current)
        return len(seen) - 1, operator.metric(LOADS)

    # Two rotations, each served (one load for the first certificate, one per rotation).
    eventually(rotate_while_creating, lambda state: state[0] >= 2 and state[1] >= 3 or refused,
               timeout=75, interval=0,
               expected="two rotations of the serving certificate, each loaded, while "
                        "TrainJobs are created")
    assert not refused, f"{len(refused)} of {creates} creates refused: {refused[:3]}"
    data = secret_data(worker, namespace)
    assert served_certificate(port, data["ca.crt"]) == der(data["tls.crt"])
    assert ca_bundles(worker, name) == [data["ca.crt"]]
    assert creates > 20, creates


def test_the_shipped_identity_is_enough(multicluster, namespace, tmp_path):
    """As the ServiceAccount of manifests/operator, with only its RBAC (the one Secret and
    the one configuration by name), the operator keeps its certificate with the defaults."""
    worker = multicluster[WORKER]
    identities = [o for o in kustomize.render("operator") if o["kind"] in (
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
        "RoleBinding")]
    kustomize.apply(worker.kubeconfig, identities)
    operator_namespace = "training-operator-system"
    user, groups = service_account_user(operator_namespace, "training-operator")
    kubeconfig = multicluster.harness.issue_user_kubeconfig(WORKER, user, groups,
                                                            tmp_path / "operator.kubeconfig")
    admission = client.AdmissionregistrationV1Api(worker.api)
    shipped = "training-operator-trainjob-validator"
    port = free_port()
    admission.create_validating_webhook_configuration({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": shipped},
        "webhooks": [{
            "name": WEBHOOK, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 5,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "clientConfig": {"url": f"https://127.0.0.1:{port}{VALIDATE_PATH}"},
            "rules": [{"apiGroups": [c.TRAINER_GROUP], "apiVersions": [c.TRAINER_VERSION],
                       "resources": [c.TRAINJOBS], "operations": ["CREATE"],
                       "scope": "Namespaced"}]}]})
    operator = ServiceProcess("training_operator", kubeconfig, tmp_path / "operator.log", (
        "--namespace", namespace, "--webhook-cert-management", "internal",
        "--webhook-cert-namespace", operator_namespace, "--webhook-port", str(port),
        "--webhook-cert-extra-hosts", "127.0.0.1"))
    try:
        operator.start()
        data = secret_data(worker, operator_namespace)
        eventually(lambda: ca_bundles(worker, shipped), lambda found: found == [data["ca.crt"]],
                   expected=f"the caBundle of {shipped} set by the operator's own identity")
        eventually(lambda: create(worker, namespace, trainjob("admitted")),
                   lambda outcome: outcome == "created",
                   expected="a TrainJob admitted through the operator's own certificate")
        assert "Forbidden" not in operator.log_tail(200), operator.log_tail(200)
    finally:
        operator.stop()
        admission.delete_validating_webhook_configuration(shipped)
        try:
            worker.core.delete_namespaced_secret(SECRET, operator_namespace)
        except ApiException as err:
            if err.status != 404:
                raise
