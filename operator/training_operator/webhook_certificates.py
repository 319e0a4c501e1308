"""The webhook's certificates, made, injected and rotated by the operator itself
(``--webhook-cert-management internal``), so that a cluster needs no cert-manager.

One Secret holds them: ``ca.crt`` (the CA bundle, newest CA first), ``ca.key`` (the newest
CA's key), ``tls.crt`` and ``tls.key`` (the serving certificate). The leading replica keeps
that Secret right and copies ``ca.crt`` into the caBundle of every webhook of the
ValidatingWebhookConfiguration. Every replica, leader or standby, watches the Secret and
writes its certificate into its own certificate directory, where the webhook server (which
reloads changed files) picks it up: no restart, no wait for the kubelet's volume sync.

The rotation rule, so that no valid request is refused across a rotation:

* The CA lives ``CA_LIFETIMES`` times as long as a serving certificate. It is renewed at
  ``RENEW_AT`` of its life; that write only puts the new CA at the head of the bundle (older
  CAs stay there until they expire) and leaves the serving certificate as it is.
* The serving certificate is renewed at ``RENEW_AT`` of its life (at once when it is
  missing, broken, expired, not signed by a CA of the bundle, or for other names), always
  under the newest CA, and only once that CA is in the caBundle of every webhook and has
  been for ``settle_time`` (the apiserver reloads a webhook configuration through its own
  watch, a moment after the write). Only a Secret with no usable serving certificate gets
  one at once: nothing that works is replaced before the apiserver trusts its successor.

So the apiserver trusts a CA before any replica serves a certificate it signed, and still
trusts the previous certificate's CA while replicas move over to the new one.
"""

from __future__ import annotations

import base64
import datetime
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from controller_kit import ca_rotation

# The rule itself, shared with the dispatcher's remote view (re-exported: the operator's
# tests and messages name these here).
from controller_kit.ca_rotation import (  # noqa: F401
    CA_CRT,
    CA_KEY,
    CA_LIFETIMES,
    MAX_SETTLE,
    RENEW_AT,
    SECRET_KEYS,
    TLS_CRT,
    TLS_KEY,
    Hosts,
    Plan,
    decode,
    fingerprint,
    pem_bundle,
    read_bundle,
    renew_time,
    serving_problem,
    settle_time,
    write_served_files,
)
from controller_kit.certificates import issued_at
from controller_kit.informer import Informer
from controller_kit.kubeclient import describe_error

log = logging.getLogger(__name__)

# The rule's messages name the flag a shortened validity came from.
plan = functools.partial(ca_rotation.plan, validity_source="--webhook-cert-validity")

# What a replica writes into its certificate directory (ca.crt: for the trainer status
# endpoint's pods).
SERVED_KEYS = (TLS_CRT, TLS_KEY, CA_CRT)
DEFAULT_VALIDITY = datetime.timedelta(days=365)
# The leader looks at the Secret and the webhook configuration at least this often (someone
# may have changed either), and sooner when something falls due.
RESYNC_SECONDS = 60.0
RETRY_SECONDS = (1.0, 30.0)  # first and longest pause after a failed pass
MANAGED_BY_LABEL = {"app.kubernetes.io/managed-by": "training-operator"}
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class CertificateSettings:
    """Where the certificates live and what they are for (the ``--webhook-*`` flags)."""

    namespace: str
    secret: str
    service: str
    webhook_configuration: str
    extra_hosts: tuple[str, ...] = ()
    validity: datetime.timedelta = DEFAULT_VALIDITY

    @property
    def hosts(self) -> Hosts:
        return Hosts.for_service(self.service, self.namespace, self.extra_hosts)

    @property
    def secret_ref(self) -> str:
        return f"Secret {self.namespace}/{self.secret}"


# --- serving what the Secret holds ------------------------------------------------------

class CertificateMetrics:
    def __init__(self, registry: CollectorRegistry | None):
        self.secret_writes = Counter(
            "training_operator_webhook_certificate_secret_writes_total",
            "Writes of the webhook certificate Secret by this replica (as leader)",
            registry=registry)
        self.injections = Counter(
            "training_operator_webhook_certificate_ca_injections_total",
            "caBundle updates of the ValidatingWebhookConfiguration by this replica",
            registry=registry)
        self.loads = Counter(
            "training_operator_webhook_certificate_loads_total",
            "Certificates from the Secret written into this replica's certificate directory",
            registry=registry)
        self.expiry = Gauge(
            "training_operator_webhook_certificate_expiry_timestamp_seconds",
            "When the serving certificate this replica serves expires (Unix time)",
            registry=registry)


class WebhookCertificates:
    """Keeps the webhook's certificates (module docstring): serves what the Secret holds in
    ``cert_dir`` on every replica; keeps the Secret and the caBundle while ``is_leader()``."""

    def __init__(self, api: client.ApiClient, settings: CertificateSettings, cert_dir: Path,
                 is_leader: Callable[[], bool], registry: CollectorRegistry | None = None):
        self.settings = settings
        self.cert_dir = Path(cert_dir)
        self.is_leader = is_leader
        self.metrics = CertificateMetrics(registry)
        self.serving = threading.Event()  # set once cert_dir holds a certificate
        self._core = client.CoreV1Api(api)
        self._admission = client.AdmissionregistrationV1Api(api)
        self.secret = Informer(f"secret {settings.namespace}/{settings.secret}",
                               self._list_secret)
        self.secret.add_handler(self._on_secret)
        self._served: dict[str, bytes] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # When this process put each CA (by fingerprint) into the caBundle (monotonic).
        self._injected_at: dict[str, float] = {}
        self._said: str | None = None
        self._missing_configuration = False

    def _list_secret(self, **kwargs):
        # One object, by name: RBAC can limit list and watch to it (resourceNames).
        return self._core.list_namespaced_secret(
            self.settings.namespace, field_selector=f"metadata.name={self.settings.secret}",
            **kwargs)

    # --- running --------------------------------------------------------------------

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that keeps the Secret (the leader) and the files (every replica)."""
        return self._thread

    def start(self) -> WebhookCertificates:
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        self.secret.start()
        self._thread = threading.Thread(target=self._keep, name="webhook-certificates",
                                        daemon=True)
        self._thread.start()
        log.info("webhook certificates: serving what %s holds in %s; the leader keeps it "
                 "(for %s) and the caBundle of ValidatingWebhookConfiguration %s",
                 self.settings.secret_ref, self.cert_dir, self.settings.hosts,
                 self.settings.webhook_configuration)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.secret.stop()
        if self._thread is not None:
            self._thread.join(5)

    # --- every replica: serve what the Secret holds -----------------------------------

    def _on_secret(self, kind: str, old: dict | None, new: dict | None) -> None:
        self._wake.set()  # a deleted or changed Secret: the leader looks at once
        if new is None:
            return
        data = decode(new.get("data"))
        problem = serving_problem(data, read_bundle(data.get(CA_CRT)),
                                  datetime.datetime.now(datetime.UTC))
        if problem:
            log.info("%s: nothing to serve yet (%s)", self.settings.secret_ref, problem)
            return
        files = {name: data[name] for name in SERVED_KEYS}
        if files == self._served:
            return
        try:
            write_served_files(self.cert_dir, files)
        except OSError as err:
            log.error("cannot write the webhook certificate into %s (%s); the webhook serves "
                      "the previous one. The directory must be writable (an emptyDir in a "
                      "Pod)", self.cert_dir, err)
            return
        self._served = files
        cert = read_bundle(files[TLS_CRT])[0]
        self.metrics.loads.inc()
        self.metrics.expiry.set(cert.not_valid_after_utc.timestamp())
        log.info("webhook certificate from %s in place (serial %x, for %s, expires %s)",
                 self.settings.secret_ref, cert.serial_number, Hosts.of(cert),
                 cert.not_valid_after_utc)
        self.serving.set()

    # --- the leader: keep the Secret and the caBundle ---------------------------------

    def _keep(self) -> None:
        failures = 0
        while not self._stop.is_set():
            delay = 1.0  # a standby looks again whether it leads now (no API call)
            if self.is_leader():
                try:
                    delay = min(self.reconcile(), RESYNC_SECONDS,
                                max(1.0, self.settings.validity.total_seconds() / 10))
                    failures = 0
                    self._said = None
                except Exception as err:  # noqa: BLE001 - logged and retried, never fatal
                    delay = min(RETRY_SECONDS[0] * 2 ** failures, RETRY_SECONDS[1])
                    failures += 1
                    self._failed(err, delay)
            self._wake.wait(delay)
            self._wake.clear()

    def _failed(self, err: Exception, delay: float) -> None:
        why = describe_error(err)
        hint = ""
        if isinstance(err, ApiException) and err.status in (401, 403):
            hint = (f" The operator's identity needs get/list/watch/update on "
                    f"{self.settings.secret_ref}, create on secrets in {self.settings.namespace} "
                    f"and get/patch on ValidatingWebhookConfiguration "
                    f"{self.settings.webhook_configuration} "
                    "(manifests/operator/webhook-cert-rbac.yaml).")
        message = f"webhook certificates: {why}.{hint}"
        if message != self._said:
            log.warning("%s Retrying (next in %.0fs).", message, delay)
            self._said = message
        else:
            log.debug("%s Retrying in %.0fs.", message, delay)

    def reconcile(self) -> float:
        """One pass of the leader: the Secret as the rotation rule wants it, then its CA
        bundle in every webhook; returns the seconds until the next pass."""
        settings = self.settings
        try:
            secret = self._core.read_namespaced_secret(settings.secret, settings.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            secret = None
        data = decode(secret.data if secret is not None else None)
        configuration = self._read_configuration()
        if configuration is not None:
            self._missing_configuration = False
        trusted = _configured_cas(configuration)
        now = datetime.datetime.now(datetime.UTC)
        settle = settle_time(settings.validity).total_seconds()

        def ca_settled(ca: x509.Certificate) -> bool:
            mark = fingerprint(ca)
            if trusted is not None and mark not in trusted:
                return False  # injected below; certificates it signs wait for that
            injected = self._injected_at.get(mark)
            if injected is not None and time.monotonic() - injected < settle:
                return False
            return (now - issued_at(ca)).total_seconds() >= settle

        step = plan(data, settings.hosts, settings.validity, now, ca_settled,
                    common_name=settings.service)
        if step.data is not None:
            if not self._write_secret(secret, step.data):
                return 0.5  # someone else wrote meanwhile: look at what they wrote
            self.metrics.secret_writes.inc()
            log.info("%s written: %s", settings.secret_ref, step.reason)
            data = step.data
        elif step.reason:
            log.debug("%s: %s", settings.secret_ref, step.reason)
        if data.get(CA_CRT) and configuration is not None:
            self._inject(configuration, data[CA_CRT])
        return step.recheck_in

    def _write_secret(self, secret: client.V1Secret | None, data: dict[str, bytes]) -> bool:
        """Create or update (with the resourceVersion read) the Secret; False on a
        conflict."""
        encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
        settings = self.settings
        try:
            if secret is None:
                self._core.create_namespaced_secret(settings.namespace, client.V1Secret(
                    metadata=client.V1ObjectMeta(name=settings.secret,
                                                 namespace=settings.namespace,
                                                 labels=dict(MANAGED_BY_LABEL)),
                    type="kubernetes.io/tls", data=encoded))
            else:
                # Other keys are left out: the Secret is this operator's alone.
                secret.data = encoded
                secret.metadata.managed_fields = None
                self._core.replace_namespaced_secret(settings.secret, settings.namespace,
                                                     secret)
        except ApiException as err:
            if err.status == 409:
                log.info("%s changed meanwhile (%s); reading it again", settings.secret_ref,
                         "created" if secret is None else "conflict")
                return False
            raise
        return True

    def _read_configuration(self) -> client.V1ValidatingWebhookConfiguration | None:
        try:
            return self._admission.read_validating_webhook_configuration(
                self.settings.webhook_configuration)
        except ApiException as err:
            if err.status != 404:
                raise
        if not self._missing_configuration:
            log.warning("webhook certificates: no ValidatingWebhookConfiguration %s: no "
                        "caBundle to keep (looking again every %.0fs)",
                        self.settings.webhook_configuration, RESYNC_SECONDS)
            self._missing_configuration = True
        return None

    def _inject(self, configuration: client.V1ValidatingWebhookConfiguration,
                bundle: bytes) -> None:
        wanted = base64.b64encode(bundle).decode()
        webhooks = configuration.webhooks or []
        if all(w.client_config.ca_bundle == wanted for w in webhooks):
            return
        before = _configured_cas(configuration) or set()
        # webhooks merge by name: only caBundle changes; the resourceVersion makes it
        # conditional on the configuration read.
        patch = {"metadata": {"resourceVersion": configuration.metadata.resource_version},
                 "webhooks": [{"name": w.name, "clientConfig": {"caBundle": wanted}}
                              for w in webhooks]}
        try:
            self._admission.patch_validating_webhook_configuration(
                configuration.metadata.name, patch, _content_type=STRATEGIC_MERGE)
        except ApiException as err:
            if err.status == 409:
                self._wake.set()  # changed meanwhile: the next pass reads it again
                return
            raise
        now = time.monotonic()
        for ca in read_bundle(bundle):
            if fingerprint(ca) not in before:
                self._injected_at[fingerprint(ca)] = now
        self.metrics.injections.inc()
        log.info("caBundle of ValidatingWebhookConfiguration %s set from %s (%d CA(s), for "
                 "%d webhook(s))", configuration.metadata.name, self.settings.secret_ref,
                 len(read_bundle(bundle)), len(webhooks))


def _configured_cas(configuration: client.V1ValidatingWebhookConfiguration | None
                    ) -> set[str] | None:
    """The CAs every webhook of the configuration trusts (fingerprints); None without a
    configuration."""
    if configuration is None:
        return None
    trusted: set[str] | None = None
    for webhook in configuration.webhooks or []:
        bundle = webhook.client_config.ca_bundle
        marks = {fingerprint(c) for c in read_bundle(base64.b64decode(bundle))} if bundle \
            else set()
        trusted = marks if trusted is None else trusted & marks
    return trusted or set()
