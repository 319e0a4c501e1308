"""Where the admission webhook listens: ``--webhook-host ::`` (the shipped Deployment's) is
every interface of both address families, so an IPv6-only cluster's apiserver reaches it as
well as an IPv4 one's; where the machine has no IPv6 it falls back to IPv4 alone
(0.0.0.0). Shown with a listener of its own, and with the training operator as a real
apiserver calls it: one configuration whose two webhooks call it at ``[::1]`` and at
``127.0.0.1`` (``127.0.0.1`` alone without IPv6), both of which must answer for a TrainJob
to be written."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.controlplane import free_port
from clusters.testing import eventually, ipv6_loopback, plain_get
from controller_kit.certificates import CertificateAuthority, cert_pem, key_pem
from training_operator.webhook_server import VALIDATE_PATH, WebhookServer

IPV6 = ipv6_loopback()
HOSTS = ("::1", "127.0.0.1") if IPV6 else ("127.0.0.1",)
TRAINER = ("trainer.kubeflow.org", "v1alpha1")
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def test_every_interface_is_both_families_or_ipv4_alone(tmp_path):
    authority = CertificateAuthority.create("webhook test CA")
    key, cert = authority.issue("webhook", dns_names=("localhost",),
                                ip_addresses=("127.0.0.1", "::1"), server=True)
    (tmp_path / "tls.crt").write_bytes(cert_pem(cert))
    (tmp_path / "tls.key").write_bytes(key_pem(key))
    ca = tmp_path / "ca.crt"
    ca.write_bytes(cert_pem(authority.cert))
    server = WebhookServer(0, tmp_path, lookups=None, host="::")
    server.start()
    try:
        if IPV6:
            assert server.url == f"https://[::]:{server.port}{VALIDATE_PATH}"
        else:  # the fallback, where the kernel has no IPv6
            assert server.host == "0.0.0.0", server.url
        for host in HOSTS:
            assert plain_get(server.port, "/healthz", host, timeout=10, ca=ca) == \
                (200, "ok"), host
    finally:
        server.stop()


@pytest.fixture
def webhook_configuration(multicluster):
    admission = client.AdmissionregistrationV1Api(multicluster["worker-1"].api)
    made: list[str] = []

    def create(body: dict) -> None:
        admission.create_validating_webhook_configuration(body)
        made.append(body["metadata"]["name"])

    yield create
    for name in made:
        try:
            admission.delete_validating_webhook_configuration(name)
        except ApiException as err:
            if err.status != 404:
                raise


def test_the_apiserver_reaches_the_operators_webhook_on_every_address_family(
        multicluster, namespace, run_operator, webhook_configuration, tmp_path):
    worker = multicluster["worker-1"]
    certs = tmp_path / "webhook-certs"
    ca = multicluster.harness.issue_serving_certificate("worker-1", certs,
                                                        ("127.0.0.1", "::1", "localhost"))
    port = free_port()
    run_operator(worker, "--namespace", namespace, "--webhook-host", "::", "--webhook-port",
                 str(port), "--webhook-cert-dir", str(certs))
    # Only this test's namespace goes through these webhooks: nothing else on the cluster
    # waits for this operator.
    webhook_configuration({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"{namespace}-webhook-listener"},
        "webhooks": [{
            "name": f"{family}.{namespace}.listener.trainer.kubeflow.org",
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 10,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "clientConfig": {"url": f"https://{url_host}:{port}{VALIDATE_PATH}",
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()},
            "rules": [{"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["v1alpha1"],
                       "resources": ["trainjobs"], "operations": ["CREATE", "UPDATE"],
                       "scope": "Namespaced"}],
        } for family, url_host in (("ipv6", "[::1]"), ("ipv4", "127.0.0.1"))
            if family == "ipv4" or IPV6],
    })

    def create(name: str, **spec) -> str:
        body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": name}, "spec": {"runtimeRef": {"name": "no-such"},
                                                     **spec}}
        try:
            worker.custom.create_namespaced_custom_object(*TRAINER, namespace, "trainjobs",
                                                          body)
            return "created"
        except ApiException as err:
            return json.loads(err.body)["message"]

    # Refused by the operator's rules (a runtime it does not have), through whichever
    # webhook the apiserver calls first; once the configuration is loaded.
    refused = eventually(lambda: create("orphan"), lambda said: said != "created",
                         expected="the apiserver to call the webhooks", timeout=30)
    assert "spec.runtimeRef: ClusterTrainingRuntime no-such not found" in refused, refused
    # Admitted: every webhook of the configuration answered, on each address family.
    assert create("remote", managedBy=MULTIKUEUE) == "created"
    for host in HOSTS:
        assert plain_get(port, "/healthz", host, timeout=10, ca=ca) == (200, "ok"), host
