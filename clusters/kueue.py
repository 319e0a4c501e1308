"""Kueue (the version ``clusters/binaries.py`` pins) as a process beside a harness cluster:
its CRDs, admission webhooks and configuration, read from the Kueue module in the Go module
cache when the cluster starts. Nothing of Kueue's is copied into this repository.

What the harness decides itself:

* **Integrations.** Chosen per cluster (``integrations``), among those the harness can
  serve (``SUPPORTED_INTEGRATIONS``): TrainJobs alone by default (``INTEGRATIONS``), or
  what a MultiKueue team typically enables, batch Jobs, JobSets and TrainJobs
  (``MULTIKUEUE_TEAM_INTEGRATIONS``). Only the webhooks of Kueue's own kinds and of the
  enabled kinds are installed (by API group and resource): Kueue answers the others with
  a no-op, but a webhook is one more call on every create of that kind, and Kueue's pod
  webhook would see every pod of the cluster. The kinds' APIs must be served: batch Jobs
  are built in, and every cluster running Kueue serves the JobSet CRD (``clusters.local``).
* **Webhooks and CRD conversion** are called on the controller's loopback port. Kueue
  serves its CRDs' v1beta1 <-> v1beta2 conversion itself, so the CRDs that convert point
  at it too.
* **Certificates.** Kueue 0.19 reads its metrics certificate from a fixed path under
  ``/etc`` unless it manages its certificates itself, so it runs with internal certificate
  management on, and the harness hands it a certificate it accepts: the webhook Secret is
  created beforehand with a CA of its own and a serving certificate for the webhook
  Service's DNS name, ``localhost`` and ``127.0.0.1``, and the same files are put into the
  certificate directory (where a Deployment would mount the Secret). Kueue finds them
  valid, keeps them, and injects that CA into the webhook configurations and CRDs, which
  the harness already did.
* **Configuration.** Namespace ``kueue-system``, no leader election, metrics and health on
  the cluster's own free loopback ports, the on-demand visibility server off (it would
  bind 8082 on every interface), and the MultiKueue dispatcher settable per cluster.
  ``WorkloadRequestUseMergePatch`` is on: Kueue then writes Workload status with merge
  patches, so the ``nominatedClusterNames`` an external dispatcher wrote are cleared when a
  worker admits (Kueue's documented alternative, a MutatingAdmissionPolicy, needs
  Kubernetes 1.36).
"""

from __future__ import annotations

import base64
import copy
import datetime
import functools
import shutil
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import binaries as provisioning

COMPONENT = "kueue"
NAMESPACE = "kueue-system"
PORTS = ("kueue-webhook", "kueue-health", "kueue-metrics")
FIELD_MANAGER = "trainjob-clusters"

# Kueue's names for its built-in dispatchers (Configuration multiKueue.dispatcherName).
DISPATCHER_ALL_AT_ONCE = "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"
DISPATCHER_INCREMENTAL = "kueue.x-k8s.io/multikueue-dispatcher-incremental"
# The AdmissionCheck controller name of Kueue's MultiKueue.
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
# Kueue's integration names (Configuration integrations.frameworks) the harness can
# serve, and the (API group, resource) of each: its webhooks are installed.
SUPPORTED_INTEGRATIONS = {
    "batch/job": ("batch", "jobs"),
    "jobset.x-k8s.io/jobset": ("jobset.x-k8s.io", "jobsets"),
    "trainer.kubeflow.org/trainjob": ("trainer.kubeflow.org", "trainjobs"),
}
# The default: TrainJobs only.
INTEGRATIONS = ("trainer.kubeflow.org/trainjob",)
# What a MultiKueue team typically enables: once its manager's multiKueue.dispatcherName
# names an external dispatcher, every one of these kinds waits for that dispatcher.
MULTIKUEUE_TEAM_INTEGRATIONS = ("batch/job", "jobset.x-k8s.io/jobset",
                                "trainer.kubeflow.org/trainjob")
# Kueue's own kinds: their webhooks are always installed.
KUEUE_API_GROUP = "kueue.x-k8s.io"
FEATURE_GATES = {"VisibilityOnDemand": False, "WorkloadRequestUseMergePatch": True}

# Paths inside the Kueue module.
CRDS_DIR = "config/components/crd/bases"
# Which CRDs Kueue converts: the patches its CRD kustomization applies.
CRD_KUSTOMIZATION = "config/components/crd/kustomization.yaml"
WEBHOOKS = "config/components/webhook/manifests.yaml"
# Kueue's kustomize overlay prefixes every name with this; its certificate management
# looks for the webhook configurations by the prefixed names.
NAME_PREFIX = "kueue-"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
# Where Kueue's release keeps its Configuration.
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
# The CA name Kueue's certificate management checks its CA certificate against.
CA_NAME = "kueue-ca"
# Kueue renews a certificate that expires within 90 days: give it more.
CERT_VALIDITY = datetime.timedelta(days=365)


def check_integrations(integrations: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``integrations`` as a tuple, refused (ValueError naming each) when empty or when one
    is not among ``SUPPORTED_INTEGRATIONS``."""
    names = tuple(dict.fromkeys(integrations))
    unknown = [name for name in names if name not in SUPPORTED_INTEGRATIONS]
    if unknown or not names:
        raise ValueError(
            f"Kueue integrations {', '.join(unknown) or '(none)'}: "
            f"{'not served by this harness' if unknown else 'at least one is needed'}; "
            f"choose among {', '.join(SUPPORTED_INTEGRATIONS)}")
    return names


@functools.cache
def module_dir() -> Path:
    return provisioning.module_dir(COMPONENT)


@functools.cache
def _read(path: Path) -> tuple[dict, ...]:
    # Kueue's Workload CRD is 1.4 MB of YAML: parsed once per process, with libyaml when
    # PyYAML has it (seconds faster than the pure-Python parser).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(path.read_text(), Loader=loader) if d)


def _documents(path: Path) -> list[dict]:
    return copy.deepcopy(list(_read(path)))


# --- CRDs and webhooks ------------------------------------------------------------------


def crds(url_base: str, ca_bundle: bytes) -> list[dict]:
    """Kueue's CRDs; those Kueue converts between versions call ``url_base``/convert."""
    kueue = module_dir()
    kustomization = yaml.safe_load((kueue / CRD_KUSTOMIZATION).read_text()) or {}
    patched = kueue / Path(CRD_KUSTOMIZATION).parent
    converted = {doc["metadata"]["name"]
                 for patch in kustomization.get("patches") or []
                 for doc in _documents(patched / patch["path"])
                 if (doc.get("spec") or {}).get("conversion", {}).get("strategy") == "Webhook"}
    found = []
    for path in sorted((kueue / CRDS_DIR).glob("*.yaml")):
        for crd in _documents(path):
            if crd.get("kind") != "CustomResourceDefinition":
                continue
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": f"{url_base}/convert",
                                     "caBundle": base64.b64encode(ca_bundle).decode()},
                    "conversionReviewVersions": ["v1"]}}
            found.append(crd)
    if not found:
        raise FileNotFoundError(f"no CustomResourceDefinition under {kueue / CRDS_DIR}")
    return found


def webhook_configurations(url_base: str, ca_bundle: bytes,
                           integrations: tuple[str, ...] = INTEGRATIONS) -> list[dict]:
    """Kueue's webhook configurations for its own kinds and those of ``integrations``,
    pointed at the controller's loopback address instead of a Service."""
    wanted = {SUPPORTED_INTEGRATIONS[name] for name in check_integrations(integrations)}
    configured = []
    for document in _documents(module_dir() / WEBHOOKS):
        document = copy.deepcopy(document)
        document["metadata"]["name"] = NAME_PREFIX + document["metadata"]["name"]
        kept = []
        for webhook in document.get("webhooks", []):
            kinds = {(group, resource.split("/")[0])
                     for rule in webhook.get("rules", [])
                     for group in rule.get("apiGroups", [])
                     for resource in rule.get("resources", [])}
            if not kinds or not all(group == KUEUE_API_GROUP or (group, resource) in wanted
                                    for group, resource in kinds):
                continue
            path = webhook["clientConfig"]["service"].get("path", "")
            webhook["clientConfig"] = {"url": url_base + path,
                                       "caBundle": base64.b64encode(ca_bundle).decode()}
            kept.append(webhook)
        document["webhooks"] = kept
        configured.append(document)
    return configured


def install(api: client.ApiClient, url_base: str, certs: KueueCertificates,
            config: dict) -> list[dict]:
    """The namespace, the webhook Secret, the webhook configurations (for the
    integrations ``config`` enables) and the ConfigMap holding ``config`` (where Kueue's
    release keeps its Configuration, so what reads it there finds what this Kueue runs
    with); returns the CRDs for the caller to install with the rest."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except ApiException as err:
        if err.status != 409:
            raise
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=WEBHOOK_SECRET, namespace=NAMESPACE),
        data={name: base64.b64encode(data).decode() for name, data in certs.secret_data().items()})
    try:
        core.create_namespaced_secret(NAMESPACE, secret)
    except ApiException as err:
        if err.status != 409:
            raise
        core.replace_namespaced_secret(WEBHOOK_SECRET, NAMESPACE, secret)
    publish_configuration(api, config)
    admission = client.AdmissionregistrationV1Api(api)
    integrations = tuple(config["integrations"]["frameworks"])
    for document in webhook_configurations(url_base, certs.ca_cert, integrations):
        name = document["metadata"]["name"]
        patch = (admission.patch_mutating_webhook_configuration
                 if document["kind"] == "MutatingWebhookConfiguration"
                 else admission.patch_validating_webhook_configuration)
        patch(name, document, field_manager=FIELD_MANAGER, force=True,
              _content_type="application/apply-patch+yaml")
    return crds(url_base, certs.ca_cert)


def publish_configuration(api: client.ApiClient, config: dict) -> None:
    """``config`` into the ConfigMap where Kueue's release keeps its Configuration."""
    client.CoreV1Api(api).patch_namespaced_config_map(CONFIG_MAP, NAMESPACE, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {CONFIG_KEY: yaml.safe_dump(config, sort_keys=False)},
    }, field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")


# --- certificates -----------------------------------------------------------------------


class KueueCertificates:
    """A CA and a webhook serving certificate in the form Kueue's certificate management
    accepts (RSA keys in PKCS#1, the CA valid for ``CA_NAME``), kept in ``directory`` so a
    restart reuses them."""

    def __init__(self, directory: Path):
        self.directory = directory

    @property
    def ca_cert(self) -> bytes:
        return (self.directory / "ca.crt").read_bytes()

    def ensure(self, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> KueueCertificates:
        if (self.directory / "tls.crt").exists():
            return self
        import ipaddress

        now = datetime.datetime.now(datetime.UTC)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kueue"),
                             x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + CERT_VALIDITY)
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.SubjectAlternativeName([x509.DNSName(CA_NAME)]), critical=False)
              .add_extension(x509.KeyUsage(
                  digital_signature=True, key_cert_sign=True, crl_sign=True,
                  content_commitment=False, key_encipherment=True, data_encipherment=False,
                  key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        names: list[x509.GeneralName] = [x509.DNSName(f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc")]
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(
                    NameOID.COMMON_NAME, f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc")]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + CERT_VALIDITY)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.directory.mkdir(parents=True, exist_ok=True)
        files = {"ca.crt": _cert_pem(ca), "ca.key": _rsa_pem(ca_key),
                 "tls.crt": _cert_pem(cert), "tls.key": _rsa_pem(key)}
        for name, data in files.items():
            (self.directory / name).write_bytes(data)
            if name.endswith(".key"):
                (self.directory / name).chmod(0o600)
        return self

    def secret_data(self) -> dict[str, bytes]:
        return {name: (self.directory / name).read_bytes()
                for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}

    def serving_dir(self, directory: Path) -> Path:
        """The serving certificate where Kueue's webhook server reads it."""
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copyfile(self.directory / name, directory / name)
        (directory / "tls.key").chmod(0o600)
        return directory


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _rsa_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


# --- configuration ----------------------------------------------------------------------


def configuration(directory: Path, ports: dict[str, int], bind_address: str,
                  dispatcher: str, integrations: tuple[str, ...] = INTEGRATIONS) -> dict:
    """Kueue's Configuration for one cluster (certificates under ``directory``);
    ``dispatcher`` is its MultiKueue ``dispatcherName`` (only the manager's matters) and
    ``integrations`` the job kinds it manages (``SUPPORTED_INTEGRATIONS``)."""
    integrations = check_integrations(integrations)
    certs = KueueCertificates(directory / "pki").ensure()
    serving = certs.serving_dir(directory / "serving-certs")
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"{bind_address}:{ports['kueue-health']}"},
        "metrics": {"bindAddress": f"{bind_address}:{ports['kueue-metrics']}"},
        "webhook": {"port": ports["kueue-webhook"], "host": bind_address,
                    "certDir": str(serving)},
        "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                   "webhookSecretName": WEBHOOK_SECRET},
        "clientConnection": {"qps": 300, "burst": 500},
        "integrations": {"frameworks": list(integrations)},
        "multiKueue": {"dispatcherName": dispatcher, "gcInterval": "30s"},
        "featureGates": dict(FEATURE_GATES),
    }


def write_config(directory: Path, document: dict) -> Path:
    path = directory / "kueue-config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
