"""What an anonymous caller can hold of the secure metrics listener, in one process (no
cluster: the decisions about tokens are a stub; tests/trainjob/test_endpoint_under_load.py
has the apiserver make them): a bounded pool of threads serves the connections, one that
finds them busy waits a moment and is closed, and a connection that drips its TLS handshake
or its request headers a byte at a time is cut at its deadline, after which the listener
serves again."""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
from collections import Counter
from http import HTTPStatus

import pytest
from prometheus_client import CollectorRegistry

from clusters.testing import eventually, stretched
from controller_kit.connection_limits import ConnectionLimits
from controller_kit.metrics_auth import Decision
from controller_kit.observability import ObservabilityServer
from controller_kit.serving_certificate import ServingCertificate

TOKEN = "the-reader"
LIMITS = ConnectionLimits(threads=2, waiting=2, wait_seconds=0.5, deadline_seconds=1.5)
POOL_THREAD = "metrics-connection"


def authorize(header: str | None, path: str) -> Decision:
    if header == f"Bearer {TOKEN}":
        return Decision(HTTPStatus.OK, "reader")
    return Decision(HTTPStatus.UNAUTHORIZED, f"GET {path}: no")


@pytest.fixture
def listener():
    dropped: Counter = Counter()
    certificate = ServingCertificate(None)
    server = ObservabilityServer(0, CollectorRegistry(), None, tls=certificate.context,
                                 authorize=authorize, limits=LIMITS,
                                 on_drop=lambda reason: dropped.update([reason])).start()
    server.dropped = dropped
    yield server
    server.stop()


def scrape(port: int, token: str = TOKEN, timeout: float = 5) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                       context=ssl._create_unverified_context())
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server ended the connection (EOF or reset), or None if it did not
    within ``within`` seconds."""
    started = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except (ConnectionResetError, ssl.SSLError, OSError):
        pass
    return time.monotonic() - started


def pool_threads() -> list[str]:
    """The listeners' connection threads (an earlier test's end once their work is done)."""
    return [t.name for t in threading.enumerate()
            if re.fullmatch(rf"{POOL_THREAD}-\d+", t.name)]


def test_headers_dripped_a_byte_at_a_time_are_cut_at_the_deadline(listener):
    raw = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    tls = ssl._create_unverified_context().wrap_socket(raw)
    request = f"GET /metrics HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n".encode()
    started = time.monotonic()
    cut = None
    try:
        # One byte every 0.2 s: each read gets a byte long before any read timeout, so only
        # a deadline on the whole connection ends it.
        for byte in request * 10:
            tls.sendall(bytes([byte]))
            time.sleep(0.2)  # the drip is the attack, not a wait for the server
            if time.monotonic() - started > stretched(LIMITS.deadline_seconds + 3):
                break
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
        cut = time.monotonic() - started
    finally:
        tls.close()
    assert cut is not None, "the server kept reading a dripping request past its deadline"
    assert cut < stretched(LIMITS.deadline_seconds + 2), cut
    eventually(lambda: listener.dropped["deadline"], lambda n: n >= 1,
               expected="the cut counted as reason deadline")
    assert scrape(listener.port) == 200, "the listener serves again once the slow one is cut"


def test_a_handshake_never_finished_is_cut_at_the_deadline(listener):
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as raw:
        raw.sendall(b"\x16")  # the first byte of a TLS record, then nothing
        took = closed_by_server(raw, within=stretched(LIMITS.deadline_seconds + 3))
    assert took is not None and took < stretched(LIMITS.deadline_seconds + 2), took


def test_connections_beyond_the_pool_wait_briefly_then_are_closed_never_a_thread_each(
        listener):
    eventually(pool_threads, lambda names: len(names) == LIMITS.threads,
               expected=f"{LIMITS.threads} connection threads")
    before = {t.ident for t in threading.enumerate()}
    held = [socket.create_connection(("127.0.0.1", listener.port), timeout=5)
            for _ in range(20)]
    try:
        # Two are being served (their handshakes hang), two wait in line and are closed
        # when their wait is over (not when a thread comes free, at the others' deadline),
        # the rest are closed at once.
        closed = [closed_by_server(s, within=stretched(LIMITS.wait_seconds + 0.5))
                  for s in held[LIMITS.threads:]]
        assert all(c is not None for c in closed), closed
        new_threads = [t.name for t in threading.enumerate() if t.ident not in before]
        assert new_threads == [], f"a connection got a thread of its own: {new_threads}"
        eventually(lambda: listener.dropped["busy"], lambda n: n == len(held) - LIMITS.threads,
                   expected="every connection beyond those served counted as busy")
    finally:
        for sock in held:
            sock.close()
    # Once the hung ones are cut, a reader is served again; a stranger is told why not.
    assert eventually(lambda: scrape(listener.port, timeout=2), lambda code: code == 200,
                      expected="a scrape served after the flood", timeout=10) == 200
    assert scrape(listener.port, token="made-up") == 401
    assert len(pool_threads()) == LIMITS.threads
