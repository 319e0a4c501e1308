"""The dispatcher's secure metrics listener, started as its Deployment starts it, against
what anyone who reaches the port can send: made-up bearer tokens, each of which would cost
a TokenReview, and connections that drip their request a byte at a time. The manager's real
apiserver judges the tokens.

What holds: the reviews go through a client of their own (never the controller's, whose
requests are counted in rest_client_requests_total), within their own budget
(--metrics-auth-qps: beyond it 429, naming why, with no review sent); a refusal is kept,
so the same made-up token costs one review; slow connections are cut at their deadline on
a pool of threads that does not grow; a reader bound to the metrics-reader ClusterRole is
served throughout."""

from __future__ import annotations

import http.client
import secrets
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from clusters.controlplane import free_port
from clusters.crds import manifests_dir
from clusters.testing import apiserver_writes, eventually, holds_for, stretched
from controller_kit.connection_limits import ConnectionLimits

MISSING_CONFIG = "no-such-multikueue-config"  # the dispatcher places nothing here
TOKENREVIEWS = {("authentication.k8s.io", "tokenreviews")}
QPS = 2.0  # --metrics-auth-qps: 4 saved up
LIMITS = ConnectionLimits()  # the listener's, as shipped
MADE_UP = 60


def _reader_role() -> dict:
    documents = yaml.safe_load_all((manifests_dir() / "dispatcher" / "metrics-rbac.yaml")
                                   .read_text())
    return next(d for d in documents if d and d["metadata"]["name"].endswith("-reader"))


@pytest.fixture
def reader_token(multicluster, namespace):
    """A ServiceAccount token bound to the shipped metrics-reader ClusterRole."""
    manager = multicluster.manager
    rbac = client.RbacAuthorizationV1Api(manager.api)
    role = _reader_role()
    try:
        rbac.create_cluster_role(role)
    except ApiException as err:
        if err.status != 409:
            raise
    binding = f"{namespace}-metrics-reader"
    rbac.create_cluster_role_binding({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    manager.core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    yield manager.core.create_namespaced_service_account_token(
        "reader", namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    rbac.delete_cluster_role_binding(binding)


def get(port: int, token: str | None, timeout: float = 10) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                       context=ssl._create_unverified_context())
    try:
        conn.request("GET", "/metrics",
                     headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def samples(text: str, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


def drip(port: int, seconds: float) -> float | None:
    """Connect, finish the TLS handshake and send a request a byte every 0.2 s; seconds
    until the server cut the connection (None: not within ``seconds``)."""
    started = time.monotonic()
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        tls = ssl._create_unverified_context().wrap_socket(raw)
    except (ssl.SSLError, OSError):
        raw.close()
        return time.monotonic() - started  # closed before its handshake: the line was full
    try:
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer slow\r\n" * 20:
            tls.sendall(bytes([byte]))
            time.sleep(0.2)  # the drip is the attack, not a wait for the server
            if time.monotonic() - started > seconds:
                return None
    except (OSError, ssl.SSLError):
        return time.monotonic() - started
    finally:
        tls.close()
    return None


def test_made_up_tokens_and_slow_connections_cost_what_they_are_allowed(
        multicluster, run_dispatcher, reader_token):
    manager = multicluster.manager
    probe_port = free_port()
    dispatcher = run_dispatcher(
        manager, "--metrics-secure", "--metrics-host", "::", "--health-probe-port",
        str(probe_port), "--metrics-auth-qps", str(QPS), "--multikueue-config", MISSING_CONFIG,
        "--dashboard-port", str(free_port()))
    port = dispatcher.metrics_port
    code, text = get(port, reader_token)
    assert code == 200, text[:300]
    controller_posts = sum(v for k, v in samples(text, "rest_client_requests_total").items()
                           if ("method", "POST") in k)

    # Made-up tokens, 8 at a time: each answered 401 (reviewed: not valid) or 429 (over the
    # budget: not reviewed), never held in a queue.
    reviewed_before = apiserver_writes(manager, TOKENREVIEWS, verbs=("POST",))
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: get(port, secrets.token_urlsafe(32)), range(MADE_UP)))
    elapsed = time.monotonic() - started
    codes = [code for code, _ in answers]
    assert set(codes) <= {401, 429}, codes
    throttled = next(body for code, body in answers if code == 429)
    assert "the token was not checked: more than 2 tokens a second to verify " \
           "(--metrics-auth-qps); retry later" in throttled, throttled
    reviews = sum((apiserver_writes(manager, TOKENREVIEWS, verbs=("POST",))
                   - reviewed_before).values())
    assert reviews == codes.count(401), (reviews, codes.count(401))
    assert reviews <= 2 * QPS + QPS * elapsed + 1, (
        f"{reviews} TokenReviews in {elapsed:.1f}s, over the budget of {QPS:g}/s")

    # One made-up token sent again and again within its refusal's time costs one review.
    reviewed_before = apiserver_writes(manager, TOKENREVIEWS, verbs=("POST",))
    token = secrets.token_urlsafe(32)
    eventually(lambda: get(port, token)[0], lambda code: code == 401,
               expected="a made-up token reviewed once the budget has room", timeout=10)
    assert [get(port, token)[0] for _ in range(5)] == [401] * 5
    assert sum((apiserver_writes(manager, TOKENREVIEWS, verbs=("POST",))
                - reviewed_before).values()) == 1, "the refusal was not kept"

    # The controller's client carried none of those reviews.
    code, text = get(port, reader_token)
    assert code == 200
    own = samples(text, "metrics_auth_reviews_total")
    assert own[(("review", "tokenreview"),)] >= reviews + 1
    posts = sum(v for k, v in samples(text, "rest_client_requests_total").items()
                if ("method", "POST") in k)
    assert posts - controller_posts < reviews, (
        f"the controller's client sent {posts - controller_posts} POSTs beside {reviews} "
        "reviews")

    # Slow connections, more than the pool: each is cut at its deadline or closed unserved;
    # the pool does not grow, and the reader is served once they are gone.
    before = threads(dispatcher.proc.pid)
    with ThreadPoolExecutor(3 * LIMITS.threads) as pool:
        slow = [pool.submit(drip, port, stretched(LIMITS.deadline_seconds + 5))
                for _ in range(3 * LIMITS.threads)]
        # (Two threads of slack: the process's own, e.g. a watch started again.)
        holds_for(lambda: threads(dispatcher.proc.pid), lambda n: n <= before + 2,
                  seconds=LIMITS.deadline_seconds, expected=f"at most {before} + 2 threads "
                  "while slow connections hold the listener")
        cut = [future.result() for future in slow]
    assert all(seconds is not None for seconds in cut), cut
    code, text = eventually(lambda: get(port, reader_token), lambda answer: answer[0] == 200,
                            expected="the reader served after the slow connections",
                            timeout=20)
    dropped = samples(text, "metrics_auth_connections_dropped_total")
    assert dropped[(("reason", "deadline"),)] >= 1, dropped
    assert dropped[(("reason", "deadline"),)] + dropped[(("reason", "busy"),)] >= len(cut)
