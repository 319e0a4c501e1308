"""The certificate a process's own HTTPS listener presents (the secure metrics listener):
``tls.crt`` and ``tls.key`` from a directory, reloaded when they change (cert-manager and
Secret volumes replace them in place), or, without a directory, a self-signed one made at
start and kept in memory only, as controller-runtime does for its metrics, and renewed at
2/3 of its life, which controller-runtime's is not.

Why renewed in memory rather than kept in a Secret as the operator's webhook certificate
is: nobody verifies it (a scraper that wants to verify gives a certificate of its own CA
with ``--metrics-cert-dir``), so there is nothing to share between replicas or to inject
anywhere; a Secret would only add write access to Secrets to every process's identity.
The listener asks for the context of each new connection, so a renewal takes effect for
new connections at once, with no restart and no connection cut."""

from __future__ import annotations

import datetime
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from controller_kit.certificates import CertificateAuthority, cert_pem, key_pem

log = logging.getLogger(__name__)

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
# Short, as the kubelet's serving certificates are: a new one costs a key pair, nothing more.
SELF_SIGNED_VALIDITY = datetime.timedelta(days=1)
# A self-signed certificate is replaced once this share of its life has passed.
RENEW_AT = 2 / 3


class ServingCertificate:
    """``context()`` is the SSL context to serve with now. ``what`` names the listener in
    messages; ``flag`` the option that gave ``cert_dir``."""

    def __init__(self, cert_dir: Path | str | None, what: str = "metrics",
                 flag: str = "--metrics-cert-dir",
                 validity: datetime.timedelta = SELF_SIGNED_VALIDITY,
                 clock: Callable[[], float] = time.monotonic):
        self.cert_dir = Path(cert_dir) if cert_dir is not None else None
        self.what, self.flag = what, flag
        self.validity = validity
        self._clock = clock
        self._lock = threading.Lock()
        self._loaded: tuple[object, ssl.SSLContext] | None = None
        # The PEM chain and key of each loaded context, and the latest context that also
        # asks for a client certificate: (the context it was made from, the CA, it).
        self._pem: dict[int, tuple[bytes, bytes]] = {}
        self._verifying: tuple[ssl.SSLContext, str, ssl.SSLContext] | None = None
        self._bad_stamp: object = None
        self.self_signed_pem: bytes | None = None  # the certificate, when made here
        self._renew_at = float("inf")
        if self.cert_dir is None:
            self._loaded = (None, self._self_signed())

    def describe(self) -> str:
        """Where the certificate comes from, for the start-up log line."""
        if self.cert_dir is None:
            return (f"a self-signed certificate made at start, renewed every "
                    f"{self.validity.total_seconds() * RENEW_AT:g} s")
        return f"the certificate in {self.cert_dir}"

    def context(self, client_ca: str = "") -> ssl.SSLContext:
        """The context for a new connection: the files' current pair (a half-written or
        broken pair keeps the previous one). Raises OSError when there never was a good
        pair. With ``client_ca`` (PEM), a client certificate signed by it is required."""
        served = self._serving_context()
        if not client_ca:
            return served
        with self._lock:
            if id(served) not in self._pem:  # replaced meanwhile by another thread
                served = self._loaded[1]
            kept = self._verifying
            if kept is not None and kept[0] is served and kept[1] == client_ca:
                return kept[2]
            context = _server_context()
            _load_from_memory(context, *self._pem[id(served)])
            context.load_verify_locations(cadata=client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
            self._verifying = (served, client_ca, context)
            return context

    def _serving_context(self) -> ssl.SSLContext:
        if self.cert_dir is None:
            return self._self_signed_context()
        crt, key = self.cert_dir / CERT_FILE, self.cert_dir / KEY_FILE
        with self._lock:
            try:
                stamp = (_stamp(crt), _stamp(key))
            except OSError as err:
                if self._loaded is None:
                    raise OSError(f"{self.flag} {self.cert_dir}: cannot read "
                                  f"{Path(err.filename or crt).name}: {err.strerror}") from None
                return self._loaded[1]
            if self._loaded is not None and stamp in (self._loaded[0], self._bad_stamp):
                return self._loaded[1]
            context = _server_context()
            try:
                pem = crt.read_bytes(), key.read_bytes()
                _load_from_memory(context, *pem)
            except (ssl.SSLError, OSError) as err:
                if self._loaded is None:
                    raise OSError(f"{self.flag} {self.cert_dir}: {CERT_FILE} and {KEY_FILE} "
                                  f"are not a usable certificate and key: {err}") from None
                self._bad_stamp = stamp  # said once per broken pair, not per connection
                log.warning("cannot load the %s certificate from %s (%s); serving the "
                            "previous one", self.what, self.cert_dir, err)
                return self._loaded[1]
            if self._loaded is not None:
                log.info("%s certificate reloaded from %s", self.what, self.cert_dir)
            self._loaded = (stamp, context)
            self._pem = {id(context): pem}
            return context

    def _self_signed_context(self) -> ssl.SSLContext:
        """The self-signed context, a new one once 2/3 of the current one's life has
        passed (a connection in progress keeps the context it began with)."""
        assert self._loaded is not None
        if self._clock() < self._renew_at:
            return self._loaded[1]
        with self._lock:
            if self._clock() >= self._renew_at:  # not renewed meanwhile by another thread
                try:
                    self._loaded = (None, self._self_signed())
                except Exception:  # the current one is still valid: retry later
                    log.exception("cannot renew the self-signed %s certificate; serving the "
                                  "current one", self.what)
                    self._renew_at = self._clock() + 1.0
                    return self._loaded[1]
                log.info("self-signed %s certificate renewed", self.what)
            return self._loaded[1]

    def _self_signed(self) -> ssl.SSLContext:
        made = self._clock()
        authority = CertificateAuthority.create(f"{self.what} self-signed CA",
                                                validity=self.validity)
        host = socket.gethostname()
        dns_names = tuple(dict.fromkeys(n for n in (host, "localhost") if n))
        key, cert = authority.issue(f"{self.what} on {host}"[:64], dns_names=dns_names,
                                    ip_addresses=("127.0.0.1", "::1"), server=True,
                                    validity=self.validity)
        context = _server_context()
        pem = cert_pem(cert) + cert_pem(authority.cert), key_pem(key)
        _load_from_memory(context, *pem)
        self._pem = {id(context): pem}
        self.self_signed_pem = cert_pem(cert)
        self._renew_at = made + self.validity.total_seconds() * RENEW_AT
        return context


def _stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced (a Secret volume swaps in new files; cert-manager
    and atomic writers rename over them: a new inode) or rewritten in place (its time)."""
    info = path.stat()
    return info.st_ino, info.st_mtime_ns, info.st_size


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _load_from_memory(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """``load_cert_chain`` reads only files: hand it an anonymous in-memory file (Linux), or
    else a private temporary one removed at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("serving-certificate", os.MFD_CLOEXEC)
        try:
            with open(fd, "wb", closefd=False) as out:
                out.write(chain + b"\n" + key)  # a file may end without one
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as private:  # mode 0700
        path = Path(private) / "pair.pem"
        path.write_bytes(chain + b"\n" + key)
        context.load_cert_chain(path)
