"""The rotation rule of a self-made CA and the serving certificate it signs, kept in one
Secret (``ca.crt``: the CA bundle, newest CA first; ``ca.key``: the newest CA's key;
``tls.crt``, ``tls.key``: the serving certificate) whose CA bundle its clients are given
(a webhook configuration's or an APIService's ``caBundle``), so that no valid request is
refused across a rotation. Used by the operator for its webhook and by the dispatcher for
its remote view; each keeps the Secret and the caBundle through the API itself.

* The CA lives ``CA_LIFETIMES`` times as long as a serving certificate. It is renewed at
  ``RENEW_AT`` of its life; that write only puts the new CA at the head of the bundle (older
  CAs stay there until they expire) and leaves the serving certificate as it is.
* The serving certificate is renewed at ``RENEW_AT`` of its life (at once when it is
  missing, broken, expired, not signed by a CA of the bundle, or for other names), always
  under the newest CA, and only once ``ca_settled`` says that CA has been trusted by the
  clients long enough (``settle_time``: they reload a caBundle through their own watch, a
  moment after the write). Only a Secret with no usable serving certificate gets one at
  once: nothing that works is replaced before its successor is trusted.

``plan`` is the rule without the API (pure but for key generation); ``write_served_files``
puts what a replica serves into its certificate directory all at once."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from controller_kit.certificates import CertificateAuthority, cert_pem, issued_at, key_pem

CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SECRET_KEYS = (CA_CRT, CA_KEY, TLS_CRT, TLS_KEY)
RENEW_AT = 2 / 3
CA_LIFETIMES = 10
MAX_SETTLE = datetime.timedelta(seconds=10)


def settle_time(validity: datetime.timedelta) -> datetime.timedelta:
    """How long a new CA is trusted by the apiserver before a certificate it signed is
    served: short against the certificate's remaining third of a life."""
    return min(MAX_SETTLE, validity / 10)


@dataclass(frozen=True)
class Hosts:
    """The names a serving certificate is for: DNS names and IP addresses."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()

    @classmethod
    def for_service(cls, service: str, namespace: str, extra: tuple[str, ...] = ()) -> Hosts:
        """The Service's in-cluster names, and ``extra`` hosts (each a DNS name or an IP)."""
        dns = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
        ips: list[str] = []
        for host in extra:
            try:
                ips.append(str(ipaddress.ip_address(host)))
            except ValueError:
                dns.append(host)
        return cls(tuple(dict.fromkeys(dns)), tuple(dict.fromkeys(ips)))

    @classmethod
    def of(cls, cert: x509.Certificate) -> Hosts:
        try:
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return cls(())
        return cls(tuple(names.get_values_for_type(x509.DNSName)),
                   tuple(str(ip) for ip in names.get_values_for_type(x509.IPAddress)))

    def same_as(self, other: Hosts) -> bool:
        return (set(self.dns_names) == set(other.dns_names)
                and set(self.ip_addresses) == set(other.ip_addresses))

    def __str__(self) -> str:
        return ", ".join(self.dns_names + self.ip_addresses)


def renew_time(cert: x509.Certificate) -> datetime.datetime:
    """When a certificate falls due: ``RENEW_AT`` of the way through its life."""
    start = issued_at(cert)
    return start + (cert.not_valid_after_utc - start) * RENEW_AT


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def pem_bundle(certs: list[x509.Certificate]) -> bytes:
    return b"".join(cert_pem(cert) for cert in certs)


def read_bundle(pem: bytes | None) -> list[x509.Certificate]:
    """The certificates of a PEM bundle; none when it is missing or unreadable."""
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
        return True
    except Exception:  # noqa: BLE001 - a wrong key type or a bad signature alike: not it
        return False


def _public_der(key_or_cert) -> bytes:
    public = key_or_cert.public_key()
    return public.public_bytes(serialization.Encoding.DER,
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def _load_key(pem: bytes | None):
    if not pem:
        return None
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _usable_ca(data: Mapping[str, bytes], bundle: list[x509.Certificate],
               now: datetime.datetime) -> tuple[CertificateAuthority | None, str]:
    """The CA that signs from now on (the bundle's first certificate with ca.key), or why
    there is none."""
    key = _load_key(data.get(CA_KEY))
    if not bundle or key is None:
        missing = [k for k, ok in ((CA_CRT, bundle), (CA_KEY, key)) if not ok]
        return None, f"{' and '.join(missing)} missing or unreadable"
    cert = bundle[0]
    if _public_der(cert) != _public_der(key):
        return None, f"{CA_KEY} does not match the first certificate of {CA_CRT}"
    if not _is_ca(cert):
        return None, f"the first certificate of {CA_CRT} is not a CA"
    if cert.not_valid_after_utc <= now:
        return None, f"the CA expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z"
    return CertificateAuthority(key, cert), ""  # type: ignore[arg-type]


def serving_problem(data: Mapping[str, bytes], bundle: list[x509.Certificate],
                    now: datetime.datetime) -> str:
    """Why the Secret's serving certificate cannot be served ("" when it can)."""
    certs = read_bundle(data.get(TLS_CRT))
    key = _load_key(data.get(TLS_KEY))
    if not certs or key is None:
        missing = [k for k, ok in ((TLS_CRT, certs), (TLS_KEY, key)) if not ok]
        return f"{' and '.join(missing)} missing or unreadable"
    cert = certs[0]
    if _public_der(cert) != _public_der(key):
        return f"{TLS_KEY} does not match {TLS_CRT}"
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return (f"the serving certificate is valid only from {cert.not_valid_before_utc} to "
                f"{cert.not_valid_after_utc}")
    if not any(_signed_by(cert, ca) for ca in bundle):
        return f"the serving certificate is not signed by a CA of {CA_CRT}"
    return ""


@dataclass(frozen=True)
class Plan:
    """What the leader does with the Secret: its new content (None: keep it), why, and in
    how many seconds to look again (something falls due then)."""

    data: dict[str, bytes] | None
    reason: str
    recheck_in: float


def plan(data: Mapping[str, bytes], hosts: Hosts, validity: datetime.timedelta,
         now: datetime.datetime, ca_settled: Callable[[x509.Certificate], bool],
         common_name: str = "training-operator-webhook",
         validity_source: str = "the configured validity") -> Plan:
    """The next step of the rotation rule (module docstring) for a Secret holding ``data``.
    ``ca_settled(ca)``: whether the clients have trusted ``ca`` long enough that a
    certificate it signed may be served. ``validity_source`` names where ``validity``
    comes from in messages (e.g. the flag that set it)."""
    bundle = [c for c in read_bundle(data.get(CA_CRT)) if c.not_valid_after_utc > now]
    ca, ca_problem = _usable_ca(data, bundle, now)
    if ca is not None and renew_time(ca.cert) <= now:
        ca, ca_problem = None, (f"the CA is past {RENEW_AT:.0%} of its life (it expires at "
                                f"{ca.cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z)")
    unusable = serving_problem(data, bundle, now)
    settle = settle_time(validity).total_seconds()

    def issue(authority: CertificateAuthority) -> dict[str, bytes]:
        key, cert = authority.issue(common_name[:64], dns_names=hosts.dns_names,
                                    ip_addresses=hosts.ip_addresses, server=True,
                                    validity=validity)
        return {TLS_CRT: cert_pem(cert), TLS_KEY: key_pem(key)}

    if ca is None:
        new_ca = CertificateAuthority.create(f"{common_name[:60]}-ca",
                                             validity=validity * CA_LIFETIMES)
        new_bundle = [new_ca.cert] + [c for c in bundle if fingerprint(c) != fingerprint(
            new_ca.cert)]
        content = {CA_CRT: pem_bundle(new_bundle), CA_KEY: key_pem(new_ca.key)}
        if unusable:
            content.update(issue(new_ca))
            why = f"{ca_problem}, and {unusable}" if data else "no certificates yet"
            return Plan(content, f"{why}: a new CA and a serving certificate for {hosts}",
                        settle)
        content.update({TLS_CRT: data[TLS_CRT], TLS_KEY: data[TLS_KEY]})
        return Plan(content, f"{ca_problem}: a new CA added to the bundle; the serving "
                             "certificate moves to it at its renewal", settle)

    pruned = pem_bundle(bundle) != data.get(CA_CRT)
    if unusable:
        return Plan({CA_CRT: pem_bundle(bundle), CA_KEY: data[CA_KEY], **issue(ca)},
                    f"{unusable}: a serving certificate for {hosts}", settle)
    cert = read_bundle(data[TLS_CRT])[0]
    due = []
    if not Hosts.of(cert).same_as(hosts):
        due.append(f"the serving certificate is for {Hosts.of(cert)}, not {hosts}")
    if renew_time(cert) <= now:
        due.append(f"the serving certificate is past {RENEW_AT:.0%} of its life (it expires "
                   f"at {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z)")
    elif cert.not_valid_after_utc - now > validity * 1.1 + datetime.timedelta(minutes=1):
        # The validity was shortened (e.g. a new --webhook-cert-validity): a certificate made
        # for the longer one would otherwise be served until its own renewal.
        due.append(f"the serving certificate is valid until "
                   f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z, longer than "
                   f"{validity_source} ({validity.total_seconds():g} s)")
    if due and ca_settled(ca.cert):
        return Plan({CA_CRT: pem_bundle(bundle), CA_KEY: data[CA_KEY], **issue(ca)},
                    f"{' and '.join(due)}: a new one for {hosts}", settle)
    if due:
        return Plan(None, "waiting for the apiserver to trust the newest CA", min(1.0, settle))
    if pruned:
        return Plan({**{k: data[k] for k in SECRET_KEYS}, CA_CRT: pem_bundle(bundle)},
                    f"expired CAs left out of {CA_CRT}", settle)
    moments = [renew_time(cert), renew_time(ca.cert)] + [c.not_valid_after_utc for c in bundle]
    return Plan(None, "", max(0.5, (min(moments) - now).total_seconds()))


def decode(secret_data: Mapping[str, str] | None) -> dict[str, bytes]:
    """A Secret's ``data`` (base64 values) as bytes; unreadable entries left out."""
    decoded = {}
    for key, value in (secret_data or {}).items():
        try:
            decoded[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue
    return decoded


def write_served_files(directory: Path, files: Mapping[str, bytes]) -> None:
    """Put ``files`` into ``directory`` all at once, as the kubelet updates a Secret volume:
    each name is a link through ``..data``, a link swapped in one rename to a new folder, so
    a reader never sees a new certificate with an old key."""
    version = directory / f"..{time.strftime('%Y%m%d%H%M%S')}.{secrets.token_hex(4)}"
    version.mkdir(mode=0o700)
    for name, content in files.items():
        path = version / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
    _swap_link(directory / "..data", version.name)
    for name in files:
        link = directory / name
        if not (link.is_symlink() and os.readlink(link) == f"..data/{name}"):
            _swap_link(link, f"..data/{name}")
    for old in directory.glob("..[0-9]*"):
        if old != version and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def _swap_link(link: Path, target: str) -> None:
    temporary = link.with_name(f"{link.name}.{secrets.token_hex(4)}.tmp")
    os.symlink(target, temporary)
    os.replace(temporary, link)
