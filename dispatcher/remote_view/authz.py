"""Whether a user may do what a request asks, as the manager's RBAC says: a
SubjectAccessReview for the user (name, groups, extra) against this API's resource
(``get``/``list`` of ``trainjobpods`` or ``trainjobevents``, ``get`` of
``trainjobpods/log``) in the request's namespace.

With the pieces of the secure metrics listener (``controller_kit.metrics_auth``): the
reviews go through a client of their own with a short timeout and a budget
(``ReviewBudget``: beyond it a request is refused with 429 at once, not queued), and each
answer is kept a few seconds in a ``DecisionCache`` (grants longer than refusals, in caches
of their own), keyed by a hash of everything the review asked. A review that could not be
made is not kept (the next request asks again, within the budget)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from http import HTTPStatus

import orjson
from kubernetes import client

from controller_kit.kubeclient import RateLimitedApiClient, describe_error
from controller_kit.metrics_auth import Decision, DecisionCache, ReviewBudget, ReviewBudgetSpent
from dispatcher.remote_view import GROUP, VERSION
from dispatcher.remote_view.authn import User

REVIEW_TIMEOUT_SECONDS = 5.0
ALLOWED_TTL_SECONDS = 10.0
REFUSED_TTL_SECONDS = 2.0
MAX_CACHED = 4096
# Reviews not answered from the cache, per second, twice as many saved up (a user's
# kubectl asks a few per command, --remote-api-max-streams users opening logs at once one
# each; the aggregator's availability check, answered by discovery, asks none).
REVIEW_QPS = 50.0


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


def review_key(user: User, attributes: Attributes) -> str:
    """The cache key of a review: a SHA-256 of the user and what was asked."""
    asked = orjson.dumps([user.name, sorted(user.groups), sorted(
        (k, sorted(v)) for k, v in user.extra.items()), attributes.verb, attributes.resource,
        attributes.subresource, attributes.namespace, attributes.name])
    return hashlib.sha256(asked).hexdigest()


class AccessReviews:
    """``review(user, attributes)``: a Decision, 200 (allowed), 403 (refused, with the
    authorizer's reason), 429 (the budget is spent) or 500 (the review failed)."""

    def __init__(self, manager: client.ApiClient, user_agent: str,
                 qps: float = REVIEW_QPS):
        self.budget = ReviewBudget(qps)
        self.api = RateLimitedApiClient(manager.configuration, self.budget,
                                        request_timeout=REVIEW_TIMEOUT_SECONDS)
        self.api.user_agent = user_agent
        self.cache = DecisionCache(ALLOWED_TTL_SECONDS, REFUSED_TTL_SECONDS, MAX_CACHED,
                                   max_refusals=MAX_CACHED)

    def review(self, user: User, attributes: Attributes) -> Decision:
        key = review_key(user, attributes)
        kept = self.cache.get(key)
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
        except ReviewBudgetSpent:
            return Decision(HTTPStatus.TOO_MANY_REQUESTS,
                            f"the permission was not checked: more than {self.budget.qps:g} "
                            "SubjectAccessReviews a second for the remote view already")
        except Exception as err:  # noqa: BLE001 - an apiserver that does not answer
            return Decision(HTTPStatus.INTERNAL_SERVER_ERROR,
                            f"the permission could not be checked (SubjectAccessReview: "
                            f"{describe_error(err)})")
        allowed = bool(answer and answer.allowed)
        reason = (answer.reason or answer.evaluation_error or "") if answer else ""
        decision = Decision(HTTPStatus.OK if allowed else HTTPStatus.FORBIDDEN, reason)
        self.cache.put(key, decision)
        return decision

    def close(self) -> None:
        self.api.close()
