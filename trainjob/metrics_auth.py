"""Who may read the secure metrics listener: the bearer token of each request is
authenticated by the apiserver (TokenReview) and the user it names is authorized for
``get`` on the request's non-resource path (SubjectAccessReview), the checks
controller-runtime's secure metrics serving makes. A Prometheus bound to the
``...-metrics-reader`` ClusterRole (nonResourceURLs ``/metrics``, verb ``get``) gets in.

Each decision is kept for a short while, keyed by a hash of the token (never the token),
so a scrape every few seconds costs no API call most of the time. Tokens are never
logged."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from cachetools import TLRUCache
from kubernetes import client

from trainjob.kubeclient import describe_error
from trainjob.trainer_status import bearer_token

log = logging.getLogger(__name__)

# An allowed scraper is let in for this long without asking again; a refusal is kept for
# less, so that a RoleBinding just created takes effect soon.
ALLOWED_TTL_SECONDS = 30.0
REFUSED_TTL_SECONDS = 10.0
# Enough for every scraper there is; a flood of made-up tokens pushes out only the oldest.
MAX_CACHED_DECISIONS = 1024


@dataclass(frozen=True)
class Decision:
    """What to answer: 200 (allowed), 401 (no or invalid token), 403 (not allowed) or 500
    (the apiserver could not be asked), with a reason that names no token."""

    status: HTTPStatus
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == HTTPStatus.OK


def token_key(token: str, path: str) -> str:
    """The cache key of a decision: a SHA-256 of the token, so no token is kept."""
    return hashlib.sha256(token.encode()).hexdigest() + " " + path


class DecisionCache:
    """Decisions by key for a while: allowed ones for ``allowed_ttl`` seconds, refusals
    (401, 403) for ``refused_ttl``; failures to ask are never kept. At most ``max_entries``,
    the least recently used dropped first (cachetools' TLRUCache, one lifetime per entry)."""

    def __init__(self, allowed_ttl: float = ALLOWED_TTL_SECONDS,
                 refused_ttl: float = REFUSED_TTL_SECONDS,
                 max_entries: int = MAX_CACHED_DECISIONS,
                 clock: Callable[[], float] = time.monotonic):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.allowed_ttl, self.refused_ttl = allowed_ttl, refused_ttl
        self._lock = threading.Lock()
        self._entries: TLRUCache = TLRUCache(
            maxsize=max_entries, timer=clock,
            ttu=lambda _key, decision, now: now + self._ttl(decision))

    def _ttl(self, decision: Decision) -> float:
        if decision.status == HTTPStatus.OK:
            return self.allowed_ttl
        if decision.status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            return self.refused_ttl
        return 0.0

    def get(self, key: str) -> Decision | None:
        """The decision kept for ``key``, unless there is none or it has expired."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, decision: Decision) -> None:
        """Keep ``decision`` for its time to live (not at all for a failure to ask)."""
        if self._ttl(decision) <= 0:
            return
        with self._lock:
            self._entries[key] = decision

    def __len__(self) -> int:
        with self._lock:
            self._entries.expire()
            return len(self._entries)


class MetricsAuthorizer:
    """Decides each request to the secure metrics listener with the apiserver ``api``
    points at (the process's own cluster and identity, which needs ``create`` on
    ``tokenreviews`` and ``subjectaccessreviews``)."""

    def __init__(self, api: client.ApiClient, cache: DecisionCache | None = None):
        self.api = api
        self.cache = cache if cache is not None else DecisionCache()

    def decide(self, authorization: str | None, path: str) -> Decision:
        """The answer to a GET of ``path`` with this ``Authorization`` header."""
        token = bearer_token(authorization)
        if not token:
            return Decision(HTTPStatus.UNAUTHORIZED,
                            f"GET {path}: Authorization header: no bearer token (send "
                            "'Authorization: Bearer <token>' with a token the Kubernetes "
                            "apiserver accepts)")
        key = token_key(token, path)
        decision = self.cache.get(key)
        if decision is None:
            decision = self._ask(token, path)
            self.cache.put(key, decision)
        return decision

    def _ask(self, token: str, path: str) -> Decision:
        try:
            review = client.AuthenticationV1Api(self.api).create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)))
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
            access = client.AuthorizationV1Api(self.api).create_subject_access_review(
                client.V1SubjectAccessReview(spec=spec)).status
        except Exception as err:  # noqa: BLE001
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
