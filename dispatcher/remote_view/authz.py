"""Whether a user may do what a request asks, as the manager's RBAC says: a
SubjectAccessReview for the user (name, groups, extra) against this API's resource
(``get``/``list`` of ``trainjobpods`` or ``trainjobevents``, ``get`` of
``trainjobpods/log``) in the request's namespace. Reviews go through a client of their
own with a short timeout; each answer is kept a few seconds (grants longer than
refusals), keyed by everything the review asked."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cachetools import TTLCache
from kubernetes import client

from controller_kit.kubeclient import RateLimitedApiClient, describe_error
from dispatcher.remote_view import GROUP, VERSION
from dispatcher.remote_view.authn import User

REVIEW_TIMEOUT_SECONDS = 5.0
ALLOWED_TTL_SECONDS = 10.0
REFUSED_TTL_SECONDS = 2.0
MAX_CACHED = 4096


@dataclass(frozen=True)
class Attributes:
    verb: str
    resource: str
    namespace: str
    name: str = ""
    subresource: str = ""

    def describe(self) -> str:
        what = f'{self.verb} resource "{self.resource}' + (
            f'/{self.subresource}"' if self.subresource else '"')
        return f'{what} in API group "{GROUP}" in the namespace "{self.namespace}"'


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    failed: bool = False  # the review itself could not be made


class AccessReviews:
    def __init__(self, manager: client.ApiClient, user_agent: str):
        self.api = RateLimitedApiClient(manager.configuration, None,
                                        request_timeout=REVIEW_TIMEOUT_SECONDS)
        self.api.user_agent = user_agent
        self._lock = threading.Lock()
        self._allowed: TTLCache = TTLCache(MAX_CACHED, ALLOWED_TTL_SECONDS)
        self._refused: TTLCache = TTLCache(MAX_CACHED, REFUSED_TTL_SECONDS)

    def review(self, user: User, attributes: Attributes) -> Verdict:
        key = (user.name, user.groups, tuple(sorted((k, tuple(v))
                                                    for k, v in user.extra.items())),
               attributes)
        with self._lock:
            kept = self._allowed.get(key) or self._refused.get(key)
        if kept is not None:
            return kept
        spec = client.V1SubjectAccessReviewSpec(
            user=user.name, groups=list(user.groups), extra=user.extra or None,
            resource_attributes=client.V1ResourceAttributes(
                group=GROUP, version=VERSION, resource=attributes.resource,
                subresource=attributes.subresource or None, verb=attributes.verb,
                namespace=attributes.namespace, name=attributes.name or None))
        try:
            answer = client.AuthorizationV1Api(self.api).create_subject_access_review(
                client.V1SubjectAccessReview(spec=spec)).status
        except Exception as err:  # noqa: BLE001 - an apiserver that does not answer
            return Verdict(False, f"the permission could not be checked "
                                  f"(SubjectAccessReview: {describe_error(err)})", failed=True)
        verdict = Verdict(bool(answer and answer.allowed),
                          (answer.reason or answer.evaluation_error or "") if answer else "")
        with self._lock:
            (self._allowed if verdict.allowed else self._refused)[key] = verdict
        return verdict

    def close(self) -> None:
        self.api.close()
