"""Who may read the secure metrics listener: the bearer token of each request is
authenticated by the apiserver (TokenReview) and the user it names is authorized for
``get`` on the request's non-resource path (SubjectAccessReview), the checks
controller-runtime's secure metrics serving makes. A Prometheus bound to the
``...-metrics-reader`` ClusterRole (nonResourceURLs ``/metrics``, verb ``get``) gets in.

Anyone who reaches the port can send made-up tokens, so what they cost is bounded: the
reviews go through an API client of their own (``review_client``), never the controller's,
with a budget of their own (``ReviewBudget``: beyond it a request is refused with 429
at once, not queued); each decision is kept for a short while, keyed by a hash of the token
(never the token), grants and refusals in caches of their own so that a flood of refusals
never pushes out a grant. Tokens are never logged."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from cachetools import TTLCache
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from controller_kit.kubeclient import RateLimitedApiClient, describe_error

log = logging.getLogger(__name__)

# An allowed scraper is let in for this long without asking again; a refusal is kept for
# less, so that a RoleBinding just created takes effect soon.
ALLOWED_TTL_SECONDS = 30.0
REFUSED_TTL_SECONDS = 10.0
# Grants: enough for every scraper there is. Refusals: made-up tokens fill these, and only
# these (the oldest go first).
MAX_CACHED_DECISIONS = 1024
MAX_CACHED_REFUSALS = 4096
# Reviews of tokens not in the caches, per second, across the process (--metrics-auth-qps):
# a scrape every few seconds by a few scrapers asks a handful a minute.
REVIEW_QPS = 5.0
# A request whose review would wait longer than this for the budget is refused (429).
REVIEW_WAIT_SECONDS = 1.0
# An apiserver that does not answer a review within this long fails the request (500),
# rather than holding one of the listener's few connection threads.
REVIEW_TIMEOUT_SECONDS = 5.0
USER_AGENT_SUFFIX = "metrics-auth"


def bearer_token(header: str | None) -> str:
    """The credentials of an RFC 7235 ``Bearer`` Authorization header (scheme matched
    case-insensitively, any whitespace around); "" unless there is exactly one."""
    parts = (header or "").split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return ""
    return parts[1]


@dataclass(frozen=True)
class Decision:
    """What to answer: 200 (allowed), 401 (no or invalid token), 403 (not allowed), 429
    (too many tokens to check just now) or 500 (the apiserver could not be asked), with a
    reason that names no token."""

    status: HTTPStatus
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == HTTPStatus.OK


def token_key(token: str, path: str) -> str:
    """The cache key of a decision: a SHA-256 of the token, so no token is kept."""
    return hashlib.sha256(token.encode()).hexdigest() + " " + path


class DecisionCache:
    """Decisions by key for a while: allowed ones for ``allowed_ttl`` seconds (at most
    ``max_entries``), refusals (401, 403) for ``refused_ttl`` (at most ``max_refusals``);
    failures to ask and throttled requests are never kept. Each cache drops its oldest
    entries first when full (cachetools' TTLCache)."""

    def __init__(self, allowed_ttl: float = ALLOWED_TTL_SECONDS,
                 refused_ttl: float = REFUSED_TTL_SECONDS,
                 max_entries: int = MAX_CACHED_DECISIONS,
                 clock: Callable[[], float] = time.monotonic,
                 max_refusals: int = MAX_CACHED_REFUSALS):
        for name, value in (("max_entries", max_entries), ("max_refusals", max_refusals)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.allowed_ttl, self.refused_ttl = allowed_ttl, refused_ttl
        self._lock = threading.Lock()
        self._allowed: TTLCache = TTLCache(max_entries, allowed_ttl, timer=clock)
        self._refused: TTLCache = TTLCache(max_refusals, refused_ttl, timer=clock)

    def _cache_for(self, decision: Decision) -> TTLCache | None:
        if decision.status == HTTPStatus.OK:
            return self._allowed if self.allowed_ttl > 0 else None
        if decision.status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            return self._refused if self.refused_ttl > 0 else None
        return None

    def get(self, key: str) -> Decision | None:
        """The decision kept for ``key``, unless there is none or it has expired."""
        with self._lock:
            found = self._allowed.get(key)
            return found if found is not None else self._refused.get(key)

    def put(self, key: str, decision: Decision) -> None:
        """Keep ``decision`` for its time to live (not at all for a failure to ask)."""
        cache = self._cache_for(decision)
        if cache is None:
            return
        with self._lock:
            cache[key] = decision

    def __len__(self) -> int:
        with self._lock:
            self._allowed.expire()
            self._refused.expire()
            return len(self._allowed) + len(self._refused)


class ReviewBudgetSpent(Exception):
    """A review would have waited longer than the budget allows: the request is refused."""


class ReviewBudget:
    """``qps`` reviews a second, ``burst`` saved up, as ``kubeclient.TokenBucket`` but
    never a long wait: a review that would wait more than ``max_wait`` seconds raises
    ``ReviewBudgetSpent`` instead (a flood of made-up tokens is refused at once rather than
    holding the listener's threads in a queue)."""

    def __init__(self, qps: float = REVIEW_QPS, burst: int | None = None,
                 max_wait: float = REVIEW_WAIT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if qps <= 0:
            raise ValueError(f"qps must be more than 0, got {qps}")
        self.qps = qps
        self.burst = burst if burst is not None else max(1, int(2 * qps))
        self.max_wait = max_wait
        self._clock, self._sleep = clock, sleep
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take a token, waiting up to ``max_wait``; returns the wait."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            wait = (1 - self._tokens) / self.qps if self._tokens < 1 else 0.0
            if wait > self.max_wait:
                raise ReviewBudgetSpent(
                    f"more than {self.qps:g} tokens a second to verify (--metrics-auth-qps)")
            self._tokens -= 1
        if wait:
            self._sleep(wait)  # the token is reserved; waiting for it is the rate limit
        return wait


def review_client(api: client.ApiClient, qps: float = REVIEW_QPS) -> client.ApiClient:
    """An API client for the reviews alone: ``api``'s apiserver and identity (the same
    configuration, so a rotated ServiceAccount token is used by both), but connections,
    a budget (``ReviewBudget``) and a short timeout of its own, and a user agent that tells
    its requests apart in the apiserver's audit log. The controller's client, and its rate
    limit, never carry a review."""
    reviews = RateLimitedApiClient(api.configuration, ReviewBudget(qps),
                                   request_timeout=REVIEW_TIMEOUT_SECONDS)
    reviews.user_agent = f"{api.user_agent} {USER_AGENT_SUFFIX}"
    return reviews


class EndpointMetrics:
    """What the authenticated listener counts, on the process's registry."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "metrics_auth_requests_total", "Requests to the authenticated metrics listener "
            "by the HTTP status of the answer", ["code"], registry=registry)
        self.reviews = Counter(
            "metrics_auth_reviews_total", "TokenReviews and SubjectAccessReviews the "
            "authenticated metrics listener sent to the apiserver", ["review"],
            registry=registry)
        self.connections_dropped = Counter(
            "metrics_auth_connections_dropped_total", "Connections to the authenticated "
            "metrics listener closed unserved: busy (no free connection thread in time) or "
            "deadline (not done within the connection deadline)", ["reason"],
            registry=registry)
        for review in ("tokenreview", "subjectaccessreview"):
            self.reviews.labels(review)
        for reason in ("busy", "deadline"):
            self.connections_dropped.labels(reason)


class MetricsAuthorizer:
    """Decides each request to the secure metrics listener with the apiserver ``api``
    points at (give it a ``review_client``: the process's own cluster and identity, which
    needs ``create`` on ``tokenreviews`` and ``subjectaccessreviews``)."""

    # A spent budget is said in the log at most this often, not once per refused request.
    THROTTLE_LOG_SECONDS = 60.0

    def __init__(self, api: client.ApiClient, cache: DecisionCache | None = None,
                 metrics: EndpointMetrics | None = None):
        self.api = api
        self.cache = cache if cache is not None else DecisionCache()
        self.metrics = metrics
        self._throttle_logged = float("-inf")

    def decide(self, authorization: str | None, path: str) -> Decision:
        """The answer to a GET of ``path`` with this ``Authorization`` header."""
        decision = self._decide(authorization, path)
        if self.metrics is not None:
            self.metrics.requests.labels(str(int(decision.status))).inc()
        return decision

    def _decide(self, authorization: str | None, path: str) -> Decision:
        token = bearer_token(authorization)
        if not token:
            return Decision(HTTPStatus.UNAUTHORIZED,
                            f"GET {path}: Authorization header: no bearer token (send "
                            "'Authorization: Bearer <token>' with a token the Kubernetes "
                            "apiserver accepts)")
        key = token_key(token, path)
        decision = self.cache.get(key)
        if decision is None:
            try:
                decision = self._ask(token, path)
            except ReviewBudgetSpent as spent:
                return self._throttled(path, spent)
            self.cache.put(key, decision)
        return decision

    def _throttled(self, path: str, spent: ReviewBudgetSpent) -> Decision:
        now = time.monotonic()
        if now - self._throttle_logged >= self.THROTTLE_LOG_SECONDS:
            self._throttle_logged = now
            log.warning("GET %s: requests refused with 429: %s (said once a minute at "
                        "most)", path, spent)
        return Decision(HTTPStatus.TOO_MANY_REQUESTS,
                        f"GET {path}: the token was not checked: {spent}; retry later")

    def _review(self, kind: str, call: Callable[[], object]):
        """``call()``, counted as a review sent unless the budget kept it back."""
        sent = True
        try:
            return call()
        except ReviewBudgetSpent:
            sent = False
            raise
        finally:
            if sent and self.metrics is not None:
                self.metrics.reviews.labels(kind).inc()

    def _ask(self, token: str, path: str) -> Decision:
        try:
            review = self._review("tokenreview", lambda: client.AuthenticationV1Api(
                self.api).create_token_review(
                    client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))))
        except ReviewBudgetSpent:
            raise
        except Exception as err:  # noqa: BLE001 - an unreachable apiserver is an answer too
            log.warning("GET %s: TokenReview failed: %s", path, describe_error(err))
            return Decision(HTTPStatus.INTERNAL_SERVER_ERROR,
                            f"GET {path}: the token could not be verified (TokenReview: "
                            f"{describe_error(err)}); retry later")
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            why = status.error if status is not None and status.error else "not authenticated"
            return Decision(HTTPStatus.UNAUTHORIZED,
                            f"GET {path}: Authorization header: the bearer token is not "
                            f"valid: {why}")
        user = status.user
        spec = client.V1SubjectAccessReviewSpec(
            user=user.username, groups=user.groups, uid=user.uid, extra=user.extra,
            non_resource_attributes=client.V1NonResourceAttributes(path=path, verb="get"))
        try:
            access = self._review("subjectaccessreview", lambda: client.AuthorizationV1Api(
                self.api).create_subject_access_review(
                    client.V1SubjectAccessReview(spec=spec))).status
        except ReviewBudgetSpent:
            raise
        except Exception as err:  # noqa: BLE001 - any failure is a 500 to retry, and logged
            log.warning("GET %s by %s: SubjectAccessReview failed: %s", path, user.username,
                        describe_error(err))
            return Decision(HTTPStatus.INTERNAL_SERVER_ERROR,
                            f"GET {path}: the permission of {user.username} could not be "
                            f"checked (SubjectAccessReview: {describe_error(err)}); retry "
                            "later")
        if access is None or not access.allowed:
            why = (access.reason if access is not None and access.reason
                   else "no RBAC rule allows it")
            log.info("GET %s refused to %s: %s", path, user.username, why)
            return Decision(HTTPStatus.FORBIDDEN,
                            f"GET {path}: user {user.username} may not get the non-resource "
                            f"URL {path} ({why}); bind it to the metrics-reader ClusterRole")
        return Decision(HTTPStatus.OK, f"user {user.username} may get {path}")
