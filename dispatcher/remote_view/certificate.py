"""The certificate the remote view serves, which the aggregator verifies against the
APIService's ``caBundle`` for the name ``<service>.<namespace>.svc``.

Either given (``--remote-api-cert-dir``: ``tls.crt`` and ``tls.key``, e.g. from
cert-manager; the caBundle is then the issuer's to inject), or made by the dispatcher
itself: a Secret in its namespace holds a CA (``ca.crt``, newest first, and ``ca.key``)
and the serving certificate it signed (``tls.crt``, ``tls.key``); every replica keeps that
Secret right (writes are conditional on its resourceVersion, so two replicas never
overwrite each other), copies ``ca.crt`` into the APIService's caBundle and only then
writes the pair into a private directory of its own. Either way the pair is served by
``controller_kit.serving_certificate.ServingCertificate`` over that directory (read again
when it changes; a broken pair keeps the previous one).

The CA lives ten times as long as a serving certificate and each is renewed at 2/3 of its
life. A new CA joins the bundle (older ones stay until they expire); a serving certificate
falling due is renewed under the newest CA only once the APIService's caBundle has held
that CA for ``SETTLE_SECONDS`` (the aggregator takes a changed APIService up through its
watch), so nothing is served that the aggregator does not trust yet. Only a Secret without
a usable certificate for the Service's names gets one at once: nothing that works is
replaced before its successor is trusted."""

from __future__ import annotations

import base64
import datetime
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.certificates import CertificateAuthority, cert_pem, issued_at, key_pem
from controller_kit.kubeclient import describe_error
from controller_kit.writes import MERGE_PATCH, request_json

log = logging.getLogger(__name__)

CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SERVING_VALIDITY = datetime.timedelta(days=365)
CA_LIFETIMES = 10
RENEW_AT = 2 / 3
SYNC_SECONDS = 60.0
SETTLE_SECONDS = 10.0
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


def hosts_of(service: str, namespace: str) -> tuple[str, ...]:
    """The names the aggregator and in-cluster clients reach the Service by."""
    return (f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")


def _due(cert: x509.Certificate, now: datetime.datetime) -> bool:
    start = issued_at(cert)
    return now >= start + (cert.not_valid_after_utc - start) * RENEW_AT


def _names(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(sans.get_values_for_type(x509.DNSName))


def _public(key_or_cert) -> bytes:
    return key_or_cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
        return True
    except Exception:  # noqa: BLE001 - any failure means: not this CA's
        return False


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def plan(data: Mapping[str, bytes], hosts: tuple[str, ...], now: datetime.datetime,
         validity: datetime.timedelta = SERVING_VALIDITY,
         trusted: Collection[str] | None = None) -> tuple[dict[str, bytes] | None, str]:
    """The Secret's next content (None: keep it) and why. ``trusted``: the fingerprints of
    the CAs the aggregator trusts by now (None: nobody verifies, e.g. no APIService); a
    usable serving certificate falling due waits for the newest CA to be among them. Pure
    but for key generation."""
    try:
        bundle = [c for c in x509.load_pem_x509_certificates(data.get(CA_CRT) or b"")
                  if c.not_valid_after_utc > now]
    except ValueError:
        bundle = []
    try:
        ca_key = serialization.load_pem_private_key(data.get(CA_KEY) or b"", None)
    except (ValueError, TypeError):
        ca_key = None
    why = []
    if not bundle or ca_key is None or _public(bundle[0]) != _public(ca_key) \
            or _due(bundle[0], now):
        ca = CertificateAuthority.create("trainjob-dispatcher-remote-api-ca",
                                         validity=validity * CA_LIFETIMES)
        why.append("a new CA" if bundle else "no CA yet")
        bundle = [ca.cert] + bundle
    else:
        ca = CertificateAuthority(ca_key, bundle[0])  # type: ignore[arg-type]
    try:
        serving = x509.load_pem_x509_certificates(data.get(TLS_CRT) or b"")[0]
        serving_key = serialization.load_pem_private_key(data.get(TLS_KEY) or b"", None)
        usable = (_public(serving) == _public(serving_key)
                  and any(_signed_by(serving, c) for c in bundle)
                  and serving.not_valid_after_utc > now)
    except (ValueError, TypeError, IndexError):
        serving, usable = None, False
    content = {CA_CRT: b"".join(cert_pem(c) for c in bundle), CA_KEY: key_pem(ca.key)}
    needed = not usable or _names(serving) != set(hosts)
    if not needed and _due(serving, now) and trusted is not None \
            and fingerprint(ca.cert) not in trusted:
        why.append("the serving certificate is due and waits until the APIService's "
                   "caBundle trusts the newest CA")
        content.update({TLS_CRT: data[TLS_CRT], TLS_KEY: data[TLS_KEY]})
    elif needed or _due(serving, now):
        key, cert = ca.issue("trainjob-dispatcher-remote-api", dns_names=hosts, server=True,
                             validity=validity)
        content.update({TLS_CRT: cert_pem(cert), TLS_KEY: key_pem(key)})
        why.append(f"a serving certificate for {', '.join(hosts)}")
    else:
        content.update({TLS_CRT: data[TLS_CRT], TLS_KEY: data[TLS_KEY]})
    if content == {k: data.get(k) for k in content}:
        return None, ""
    return content, "; ".join(why) or "expired CAs left out of the bundle"


class SecretCertificate:
    """The Secret ``namespace/secret`` kept (module docstring), its CA injected into
    APIService ``apiservice``, its pair written into ``directory`` (a private temporary
    one, removed by ``stop``) once injected. ``synced`` is set once a pair was written."""

    def __init__(self, api: client.ApiClient, namespace: str, secret: str,
                 hosts: tuple[str, ...], apiservice: str,
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                     datetime.UTC),
                 settle_seconds: float = SETTLE_SECONDS):
        self.api, self.namespace, self.secret = api, namespace, secret
        self.hosts, self.apiservice, self._clock = hosts, apiservice, clock
        self.settle_seconds = settle_seconds
        self.directory = Path(tempfile.mkdtemp(prefix="remote-view-certificate-"))
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._said = ""
        self._served: bytes | None = None
        # When each CA was first seen in the APIService's caBundle (monotonic).
        self._bundled_since: dict[str, float] = {}

    @property
    def where(self) -> str:
        return f"Secret {self.namespace}/{self.secret}"

    def start(self) -> SecretCertificate:
        self.sync()
        threading.Thread(target=self._run, name="remote-view-certificate", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.wait(SYNC_SECONDS if self.synced.is_set() else 2.0):
            self.sync()

    def _say(self, level: int, message: str) -> None:
        if message != self._said:
            self._said = message
            log.log(level, "remote view: %s", message)

    def sync(self) -> None:
        """One pass: the Secret right, its CA in the APIService's caBundle, then served."""
        path = f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"
        try:
            apiservice = self._apiservice()
            try:
                secret = request_json(self.api, "GET", path, None)
            except ApiException as err:
                if err.status != 404:
                    raise
                secret = None
            data = {k: base64.b64decode(v) for k, v in
                    ((secret or {}).get("data") or {}).items()}
            content, why = plan(data, self.hosts, self._clock(),
                                trusted=self._trusted(apiservice))
            if content is not None:
                body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": self.secret, "namespace": self.namespace,
                                     "labels": {"app.kubernetes.io/managed-by":
                                                "trainjob-dispatcher"}},
                        "data": {k: base64.b64encode(v).decode() for k, v in content.items()}}
                try:
                    if secret is None:
                        request_json(self.api, "POST",
                                     f"/api/v1/namespaces/{self.namespace}/secrets", body)
                    else:
                        body["metadata"]["resourceVersion"] = \
                            secret["metadata"]["resourceVersion"]
                        request_json(self.api, "PUT", path, body)
                except ApiException as err:
                    if err.status == 409:
                        return  # another replica wrote it first: read it on the next pass
                    raise
                log.info("remote view: %s written: %s", self.where, why)
                data = content
            if apiservice is not None:
                self._inject(apiservice, data[CA_CRT])
            self._serve(data[TLS_CRT], data[TLS_KEY])
            self._say(logging.DEBUG, "")
        except Exception as err:  # noqa: BLE001 - retried on the next pass
            self._say(logging.WARNING, f"cannot keep the serving certificate in {self.where}: "
                                       f"{describe_error(err)}")

    def _apiservice(self) -> dict | None:
        try:
            return request_json(self.api, "GET", f"{APISERVICES}/{self.apiservice}", None)
        except ApiException as err:
            if err.status != 404:
                raise
        self._say(logging.INFO, f"APIService {self.apiservice} is not installed: kubectl "
                                "reaches the remote view once manifests/remote-api is applied")
        return None

    def _trusted(self, apiservice: dict | None) -> set[str] | None:
        """The CAs the aggregator trusts by now: in the caBundle for the settle time (None
        without an APIService: nothing verifies the certificate through it)."""
        if apiservice is None:
            return None
        try:
            bundled = {fingerprint(cert) for cert in x509.load_pem_x509_certificates(
                base64.b64decode((apiservice.get("spec") or {}).get("caBundle") or ""))}
        except ValueError:
            bundled = set()
        now = time.monotonic()
        self._bundled_since = {fp: self._bundled_since.get(fp, now) for fp in bundled}
        return {fp for fp, since in self._bundled_since.items()
                if now - since >= self.settle_seconds}

    def _inject(self, apiservice: dict, bundle: bytes) -> None:
        wanted = base64.b64encode(bundle).decode()
        if (apiservice.get("spec") or {}).get("caBundle") != wanted:
            request_json(self.api, "PATCH", f"{APISERVICES}/{self.apiservice}",
                         {"spec": {"caBundle": wanted}}, content_type=MERGE_PATCH)
            log.info("remote view: the CA of the serving certificate injected into "
                     "APIService %s", self.apiservice)

    def _serve(self, chain: bytes, key: bytes) -> None:
        """The pair into the directory, the key first, each replaced whole (a reader
        between the two sees a mismatched pair and keeps serving the previous one)."""
        if self._served != chain + key:
            for name, content in ((TLS_KEY, key), (TLS_CRT, chain)):
                fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.")
                with os.fdopen(fd, "wb") as out:
                    out.write(content)
                os.replace(temporary, self.directory / name)
            self._served = chain + key
        self.synced.set()
