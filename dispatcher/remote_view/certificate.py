"""The certificate the remote view serves, which the aggregator verifies against the
APIService's ``caBundle`` for the name ``<service>.<namespace>.svc``.

Either given (``--remote-api-cert-dir``: ``tls.crt`` and ``tls.key``, e.g. from
cert-manager, read again when they change; the caBundle is then the issuer's to inject),
or made by the dispatcher itself, as the operator makes its webhook's: a Secret in its
namespace holds a CA (``ca.crt``, newest first, and ``ca.key``) and the serving
certificate it signed (``tls.crt``, ``tls.key``); every replica keeps that Secret right
(writes are conditional on its resourceVersion, so two replicas never overwrite each
other) and copies ``ca.crt`` into the APIService's caBundle. The CA lives ten times as long
as a serving certificate and each is renewed at 2/3 of its life; a new CA joins the bundle
before anything it signed is served (a serving certificate is renewed under the newest CA
at its own renewal, long after)."""

from __future__ import annotations

import base64
import datetime
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


def plan(data: Mapping[str, bytes], hosts: tuple[str, ...], now: datetime.datetime,
         validity: datetime.timedelta = SERVING_VALIDITY) -> tuple[dict[str, bytes] | None, str]:
    """The Secret's next content (None: keep it) and why. Pure but for key generation."""
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
    if not usable or _due(serving, now) or _names(serving) != set(hosts):
        key, cert = ca.issue("trainjob-dispatcher-remote-api", dns_names=hosts, server=True,
                             validity=validity)
        content.update({TLS_CRT: cert_pem(cert), TLS_KEY: key_pem(key)})
        why.append(f"a serving certificate for {', '.join(hosts)}")
    else:
        content.update({TLS_CRT: data[TLS_CRT], TLS_KEY: data[TLS_KEY]})
    if content == {k: data.get(k) for k in content}:
        return None, ""
    return content, "; ".join(why) or "expired CAs left out of the bundle"


@dataclass(frozen=True)
class Pair:
    """What to serve: the certificate chain and its key (PEM), and a stamp that changes
    when they do."""

    chain: bytes
    key: bytes
    stamp: object


def load_pair(context: ssl.SSLContext, pair: Pair) -> None:
    """``load_cert_chain`` reads files only: an anonymous in-memory file (Linux), else a
    private temporary one removed at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("remote-view-certificate", os.MFD_CLOEXEC)
        try:
            os.write(fd, pair.chain + b"\n" + pair.key)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as private:
        path = Path(private) / "pair.pem"
        path.write_bytes(pair.chain + b"\n" + pair.key)
        context.load_cert_chain(path)


class DirectoryCertificate:
    """``tls.crt`` and ``tls.key`` in ``directory``, read again when they change."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._pair: Pair | None = None

    def start(self) -> DirectoryCertificate:
        self.pair()
        return self

    def pair(self) -> Pair | None:
        crt, key = self.directory / TLS_CRT, self.directory / TLS_KEY
        try:
            stamp = tuple((s.st_ino, s.st_mtime_ns, s.st_size)
                          for s in (crt.stat(), key.stat()))
            if self._pair is None or self._pair.stamp != stamp:
                self._pair = Pair(crt.read_bytes(), key.read_bytes(), stamp)
        except OSError as err:
            if self._pair is None:
                raise OSError(f"--remote-api-cert-dir {self.directory}: cannot read "
                              f"{Path(err.filename or crt).name}: {err.strerror}") from None
        return self._pair

    def stop(self) -> None:
        pass


class SecretCertificate:
    """The Secret ``namespace/secret`` kept (module docstring) and served; its CA injected
    into APIService ``apiservice``. ``pair()`` is None until the Secret was read."""

    def __init__(self, api: client.ApiClient, namespace: str, secret: str,
                 hosts: tuple[str, ...], apiservice: str,
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                     datetime.UTC)):
        self.api, self.namespace, self.secret = api, namespace, secret
        self.hosts, self.apiservice, self._clock = hosts, apiservice, clock
        self._pair: Pair | None = None
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._said = ""

    def start(self) -> SecretCertificate:
        self.sync()
        threading.Thread(target=self._run, name="remote-view-certificate", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def pair(self) -> Pair | None:
        return self._pair

    def _run(self) -> None:
        while not self._stop.wait(SYNC_SECONDS if self.synced.is_set() else 2.0):
            self.sync()

    def _say(self, level: int, message: str) -> None:
        if message != self._said:
            self._said = message
            log.log(level, "remote view: %s", message)

    def sync(self) -> None:
        """One pass: the Secret right, served, and its CA in the APIService's caBundle."""
        path = f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"
        where = f"Secret {self.namespace}/{self.secret}"
        try:
            try:
                secret = request_json(self.api, "GET", path, None)
            except ApiException as err:
                if err.status != 404:
                    raise
                secret = None
            data = {k: base64.b64decode(v) for k, v in
                    ((secret or {}).get("data") or {}).items()}
            content, why = plan(data, self.hosts, self._clock())
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
                log.info("remote view: %s written: %s", where, why)
                data = content
            self._pair = Pair(data[TLS_CRT], data[TLS_KEY], hash(data[TLS_CRT]))
            self.synced.set()
            self._inject(data[CA_CRT])
        except Exception as err:  # noqa: BLE001 - retried on the next pass
            self._say(logging.WARNING, f"cannot keep the serving certificate in {where}: "
                                       f"{describe_error(err)}")

    def _inject(self, bundle: bytes) -> None:
        path = f"{APISERVICES}/{self.apiservice}"
        try:
            current = request_json(self.api, "GET", path, None)
        except ApiException as err:
            if err.status == 404:
                self._say(logging.INFO, f"APIService {self.apiservice} is not installed: "
                                        "kubectl reaches the remote view once "
                                        "manifests/remote-api is applied")
                return
            raise
        wanted = base64.b64encode(bundle).decode()
        if (current.get("spec") or {}).get("caBundle") != wanted:
            request_json(self.api, "PATCH", path, {"spec": {"caBundle": wanted}},
                         content_type=MERGE_PATCH)
            log.info("remote view: the CA of the serving certificate injected into "
                     "APIService %s", self.apiservice)
        self._say(logging.DEBUG, "")


