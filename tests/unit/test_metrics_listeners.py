"""The pure parts of secure metrics serving: the listener flags and the rules across them,
the decision cache, the serving certificate (reloaded when its files change) and the
dual-stack listener. What the apiserver decides about a token is tested against a real
one in tests/trainjob/test_metrics_authentication.py."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from clusters.testing import ipv6_loopback
from controller_kit import listeners
from controller_kit.certificates import CertificateAuthority, cert_pem, key_pem
from controller_kit.metrics_auth import Decision, DecisionCache, token_key
from controller_kit.observability import ObservabilityServer
from controller_kit.serving_certificate import ServingCertificate
from dispatcher.config import ConfigError, load_config

ALLOWED = Decision(HTTPStatus.OK, "user reader may get /metrics")
FORBIDDEN = Decision(HTTPStatus.FORBIDDEN, "user stranger may not")
FAILED = Decision(HTTPStatus.INTERNAL_SERVER_ERROR, "TokenReview: HTTP 503")


# --- flags -------------------------------------------------------------------------------


def test_by_default_one_plain_loopback_listener_serves_everything():
    where = listeners.resolve(plain_metrics_port=8080)
    assert where == listeners.Listeners("127.0.0.1", 8080, False, None, None, None)
    assert not where.probes_apart


def test_secure_metrics_default_to_8443_with_the_probes_apart_on_8081():
    where = listeners.resolve(plain_metrics_port=8080, metrics_secure=True, metrics_host="::")
    assert (where.metrics_port, where.health_probe_host, where.health_probe_port) == (
        8443, "::", 8081)
    apart = listeners.resolve(plain_metrics_port=8080, health_probe_port=9000,
                              health_probe_host="0.0.0.0")
    assert (apart.metrics_secure, apart.metrics_port, apart.health_probe_port) == (
        False, 8080, 9000)


@pytest.mark.parametrize("settings, says", [
    ({"metrics_cert_dir": "/certs"},
     "--metrics-cert-dir is given but --metrics-secure is not"),
    ({"health_probe_host": "::"}, "--health-probe-host needs --health-probe-port"),
    ({"metrics_port": 9000, "health_probe_port": 9000},
     "--health-probe-port and --metrics-port are both 9000"),
    ({"metrics_secure": True, "metrics_port": 8081},
     "--health-probe-port and --metrics-port are both 8081"),
    ({"health_probe_port": 70000}, "--health-probe-port: must be a port number from 0 to"),
], ids=["cert-dir-without-secure", "probe-host-without-port", "same-port",
        "secure-on-the-probe-default", "port-range"])
def test_contradictory_flags_are_refused_by_name(settings, says):
    with pytest.raises(ValueError, match=says):
        listeners.resolve(plain_metrics_port=8080, **settings)


def test_any_free_port_twice_is_no_clash():
    where = listeners.resolve(plain_metrics_port=8080, metrics_port=0, health_probe_port=0)
    assert (where.metrics_port, where.health_probe_port) == (0, 0)


@pytest.mark.parametrize("module", ["dispatcher", "training_operator"])
def test_the_commands_refuse_contradictory_flags_before_connecting(module, tmp_path):
    done = subprocess.run([sys.executable, "-m", module, "run", "--kubeconfig",
                           str(tmp_path / "none"), "--metrics-cert-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "error: --metrics-cert-dir is given but --metrics-secure is not" in done.stderr, \
        done.stderr


def test_the_dispatcher_takes_the_settings_from_its_file_too(tmp_path):
    path = tmp_path / "dispatcher.yaml"
    path.write_text("metrics-secure: true\nmetrics_host: '::'\nhealth_probe_port: 9000\n")
    config = load_config(path)
    assert config.metrics_listeners() == listeners.Listeners("::", 8443, True, None, "::", 9000)
    # The dashboard never goes behind the authenticated listener: it gets its own.
    assert config.dashboard_address() == ("127.0.0.1", 8082)
    assert load_config(None).dashboard_address() is None  # beside plain loopback metrics
    path.write_text(f"metrics_cert_dir: {tmp_path}\n")
    with pytest.raises(ConfigError, match="metrics_cert_dir is given but metrics_secure is not"):
        load_config(path)


# --- the decision cache ------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_decisions_are_kept_briefly_and_failures_not_at_all():
    clock = Clock()
    cache = DecisionCache(allowed_ttl=30, refused_ttl=10, clock=clock)
    cache.put("reader", ALLOWED)
    cache.put("stranger", FORBIDDEN)
    cache.put("unlucky", FAILED)
    assert (cache.get("reader"), cache.get("stranger"), cache.get("unlucky")) == (
        ALLOWED, FORBIDDEN, None)
    clock.now += 10
    assert (cache.get("reader"), cache.get("stranger")) == (ALLOWED, None)
    clock.now += 20
    assert cache.get("reader") is None and len(cache) == 0


def test_the_cache_is_bounded_and_drops_the_oldest():
    cache = DecisionCache(max_entries=2, clock=Clock())
    for key in ("a", "b", "c"):
        cache.put(key, ALLOWED)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, ALLOWED, ALLOWED)


def test_the_cache_key_keeps_no_token():
    token = "eyJhbGciOiJSUzI1NiJ9.secret.signature"
    key = token_key(token, "/metrics")
    assert token not in key and "secret" not in key
    assert key == token_key(token, "/metrics") != token_key(token, "/other")


# --- the serving certificate and the listener --------------------------------------------


def _replace(path: Path, content: bytes) -> None:
    """Write as cert-manager and the kubelet do: a new file renamed over the old one."""
    path.with_suffix(".new").write_bytes(content)
    path.with_suffix(".new").replace(path)


def _write_pair(directory: Path, authority: CertificateAuthority) -> Path:
    key, cert = authority.issue("metrics", dns_names=("localhost",),
                                ip_addresses=("127.0.0.1", "::1"), server=True)
    _replace(directory / "tls.crt", cert_pem(cert))
    _replace(directory / "tls.key", key_pem(key))
    ca = directory.parent / f"{authority.cert.serial_number}.crt"
    ca.write_bytes(cert_pem(authority.cert))
    return ca


def _issuer(port: int, host: str = "127.0.0.1", cafile: Path | None = None) -> str:
    """The issuer CN of the certificate served at host:port, verified with ``cafile``."""
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else (
        ssl._create_unverified_context())  # the self-signed case
    with socket.create_connection((host, port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        cert = tls.getpeercert(binary_form=True)
    from cryptography import x509

    return x509.load_der_x509_certificate(cert).issuer.rfc4514_string()


def test_a_certificate_directory_is_read_again_when_its_files_change(tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    first, second = CertificateAuthority.create("first"), CertificateAuthority.create("second")
    first_ca = _write_pair(certs, first)
    certificate = ServingCertificate(certs)
    server = ObservabilityServer(0, CollectorRegistry(), None, tls=certificate.context).start()
    try:
        assert _issuer(server.port, cafile=first_ca) == "CN=first"
        second_ca = _write_pair(certs, second)
        assert _issuer(server.port, cafile=second_ca) == "CN=second"
        _replace(certs / "tls.key", b"half-written")  # a broken pair keeps the last good one
        assert _issuer(server.port, cafile=second_ca) == "CN=second"
    finally:
        server.stop()


def test_without_a_directory_a_self_signed_certificate_is_made_in_memory(tmp_path):
    certificate = ServingCertificate(None)
    assert certificate.self_signed_pem and certificate.describe().startswith("a self-signed")
    with pytest.raises(OSError, match="--metrics-cert-dir .*missing: cannot read tls.crt"):
        ServingCertificate(tmp_path / "missing").context()


def test_every_interface_means_ipv6_and_ipv4_alike():
    """``::`` serves both families; where the kernel has no IPv6, IPv4 alone on 0.0.0.0."""
    ipv6 = ipv6_loopback()
    server = ObservabilityServer(0, CollectorRegistry(), lambda: (True, "ok"), host="::").start()
    try:
        for host in ("127.0.0.1", "::1") if ipv6 else ("127.0.0.1",):
            conn = http.client.HTTPConnection(host, server.port, timeout=5)
            conn.request("GET", "/readyz")
            assert conn.getresponse().status == 200, host
            conn.close()
        expected = f"http://[::]:{server.port}" if ipv6 else f"http://0.0.0.0:{server.port}"
        assert server.url == expected
    finally:
        server.stop()


def test_the_authenticated_listener_serves_nothing_else():
    with pytest.raises(ValueError, match="cannot be served on an authenticated"):
        ObservabilityServer(0, CollectorRegistry(), None, tls=ServingCertificate(None).context,
                            authorize=lambda _header, _path: ALLOWED,
                            routes={"/": lambda _q: (200, "text/html", b"")})
    with pytest.raises(ValueError, match="over TLS only"):
        ObservabilityServer(0, CollectorRegistry(), None,
                            authorize=lambda _header, _path: ALLOWED)
