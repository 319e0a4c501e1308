"""The certificate a process's own HTTPS listener presents (the secure metrics listener):
``tls.crt`` and ``tls.key`` from a directory, reloaded when they change (cert-manager and
Secret volumes replace them in place), or, without a directory, a self-signed one made at
start and kept in memory only, as controller-runtime does for its metrics."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import tempfile
import threading
from pathlib import Path

from trainjob.certificates import CertificateAuthority, cert_pem, key_pem

log = logging.getLogger(__name__)

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"


class ServingCertificate:
    """``context()`` is the SSL context to serve with now. ``what`` names the listener in
    messages; ``flag`` the option that gave ``cert_dir``."""

    def __init__(self, cert_dir: Path | str | None, what: str = "metrics",
                 flag: str = "--metrics-cert-dir"):
        self.cert_dir = Path(cert_dir) if cert_dir is not None else None
        self.what, self.flag = what, flag
        self._lock = threading.Lock()
        self._loaded: tuple[object, ssl.SSLContext] | None = None
        self._bad_stamp: object = None
        self.self_signed_pem: bytes | None = None  # the certificate, when made here
        if self.cert_dir is None:
            self._loaded = (None, self._self_signed())

    def describe(self) -> str:
        """Where the certificate comes from, for the start-up log line."""
        if self.cert_dir is None:
            return "a self-signed certificate made at start"
        return f"the certificate in {self.cert_dir}"

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: the files' current pair (a half-written or
        broken pair keeps the previous one). Raises OSError when there never was a good
        pair."""
        if self.cert_dir is None:
            assert self._loaded is not None
            return self._loaded[1]
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
                context.load_cert_chain(crt, key)
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
            return context

    def _self_signed(self) -> ssl.SSLContext:
        authority = CertificateAuthority.create(f"{self.what} self-signed CA")
        host = socket.gethostname()
        dns_names = tuple(dict.fromkeys(n for n in (host, "localhost") if n))
        key, cert = authority.issue(f"{self.what} on {host}"[:64], dns_names=dns_names,
                                    ip_addresses=("127.0.0.1", "::1"), server=True)
        self.self_signed_pem = cert_pem(cert)
        context = _server_context()
        _load_from_memory(context, cert_pem(cert) + cert_pem(authority.cert), key_pem(key))
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
                out.write(chain + key)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as private:  # mode 0700
        path = Path(private) / "pair.pem"
        path.write_bytes(chain + key)
        context.load_cert_chain(path)
