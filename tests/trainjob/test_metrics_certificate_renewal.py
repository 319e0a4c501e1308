"""The self-signed metrics certificate is renewed at 2/3 of its life and served to new
connections at once, with no restart: in one process (a listener of its own), and in the
dispatcher started as its Deployment starts it, with a short life (--metrics-cert-validity)."""

from __future__ import annotations

import datetime
import socket
import ssl

from cryptography import x509
from prometheus_client import CollectorRegistry

from clusters.controlplane import free_port
from clusters.testing import eventually
from controller_kit.observability import ObservabilityServer
from controller_kit.serving_certificate import ServingCertificate

MISSING_CONFIG = "no-such-multikueue-config"  # the dispatcher places nothing here
LIFE = 3.0  # seconds: renewed after 2 s


def served(port: int, host: str = "127.0.0.1") -> x509.Certificate:
    """The certificate the listener at ``port`` presents to a new connection."""
    context = ssl._create_unverified_context()  # self-signed: nothing to verify
    with socket.create_connection((host, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_a_listener_serves_the_renewed_certificate_without_a_restart():
    certificate = ServingCertificate(None, validity=datetime.timedelta(seconds=LIFE))
    server = ObservabilityServer(0, CollectorRegistry(), None, tls=certificate.context).start()
    try:
        first = served(server.port)
        life = first.not_valid_after_utc - first.not_valid_before_utc
        assert life <= datetime.timedelta(minutes=5, seconds=LIFE)  # backdated 5 min
        renewed = eventually(lambda: served(server.port),
                             lambda cert: cert.serial_number != first.serial_number,
                             expected="a new certificate once 2/3 of the first's life passed",
                             timeout=10 * LIFE, interval=0.2)
        # Renewed early: the first was still valid when the new one came.
        assert renewed.not_valid_before_utc < first.not_valid_after_utc
    finally:
        server.stop()


def test_the_dispatcher_renews_its_metrics_certificate(multicluster, run_dispatcher):
    probe_port = free_port()
    dispatcher = run_dispatcher(
        multicluster.manager, "--metrics-secure", "--metrics-host", "::",
        "--metrics-cert-validity", str(LIFE), "--health-probe-port", str(probe_port),
        "--multikueue-config", MISSING_CONFIG, "--dashboard-port", str(free_port()))
    first = served(dispatcher.metrics_port)
    serials = {first.serial_number}
    for _ in range(2):  # renewed again and again, each time a new one
        renewed = eventually(lambda: served(dispatcher.metrics_port),
                             lambda cert: cert.serial_number not in serials,
                             expected="the dispatcher to serve a renewed certificate",
                             timeout=10 * LIFE, interval=0.2)
        serials.add(renewed.serial_number)
    assert "self-signed metrics certificate renewed" in dispatcher.log_tail(200)
