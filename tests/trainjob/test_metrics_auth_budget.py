"""What made-up tokens cost, without a cluster: refusals are kept beside the grants, never
in their place, and the reviews of tokens not kept have a budget of their own that refuses
at once rather than queueing. (Against a real apiserver: tests/trainjob/
test_endpoint_under_load.py.)"""

from __future__ import annotations

import secrets
from http import HTTPStatus

import pytest
from kubernetes import client

from controller_kit.metrics_auth import (
    Decision,
    DecisionCache,
    MetricsAuthorizer,
    ReviewBudget,
    ReviewBudgetSpent,
    review_client,
    token_key,
)

ALLOWED = Decision(HTTPStatus.OK, "user reader may get /metrics")
UNAUTHORIZED = Decision(HTTPStatus.UNAUTHORIZED, "not valid")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_refusals_never_pushes_out_a_grant():
    clock = Clock()
    cache = DecisionCache(max_entries=4, max_refusals=100, clock=clock)
    reader = token_key("reader-token", "/metrics")
    cache.put(reader, ALLOWED)
    for _ in range(1000):
        cache.put(token_key(secrets.token_hex(16), "/metrics"), UNAUTHORIZED)
    assert cache.get(reader) == ALLOWED
    assert len(cache) == 1 + 100  # the refusals' cache is bounded too


def test_a_refusal_is_kept_so_the_same_made_up_token_is_asked_about_once():
    clock = Clock()
    cache = DecisionCache(refused_ttl=10, clock=clock)
    key = token_key("made-up", "/metrics")
    cache.put(key, UNAUTHORIZED)
    assert cache.get(key) == UNAUTHORIZED
    clock.now += 10
    assert cache.get(key) is None


def test_the_budget_lets_a_burst_through_then_refuses_rather_than_wait_long():
    clock = Clock()
    budget = ReviewBudget(qps=5, max_wait=1.0, clock=clock, sleep=lambda seconds: None)
    assert budget.burst == 10
    assert [budget.acquire() for _ in range(10)] == [0.0] * 10
    # With the clock standing still, the next five are reserved a turn 0.2 s apart, up to
    # the longest wait allowed; the sixth would wait longer and is refused.
    assert [budget.acquire() for _ in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    with pytest.raises(ReviewBudgetSpent, match=r"more than 5 tokens a second to verify "
                       r"\(--metrics-auth-qps\)"):
        budget.acquire()
    clock.now += 0.2  # a token comes back every 0.2 s: one more may be reserved
    assert budget.acquire() == pytest.approx(1.0)
    with pytest.raises(ReviewBudgetSpent):
        budget.acquire()


def test_a_spent_budget_is_answered_429_naming_why_and_is_not_kept():
    configuration = client.Configuration(host="https://127.0.0.1:1")  # nothing listens
    cache = DecisionCache()
    authorizer = MetricsAuthorizer(review_client(client.ApiClient(configuration), qps=0.5),
                                   cache=cache)
    authorizer.api.limiter.max_wait = 0.0
    # The burst's one token: the review is sent and fails (nobody answers), said as 500.
    sent = authorizer.decide("Bearer made-up-1", "/metrics")
    assert sent.status == HTTPStatus.INTERNAL_SERVER_ERROR, sent
    assert "the token could not be verified (TokenReview:" in sent.reason
    # The next is refused before anything is sent, and says why.
    throttled = authorizer.decide("Bearer made-up-2", "/metrics")
    assert throttled == Decision(
        HTTPStatus.TOO_MANY_REQUESTS, "GET /metrics: the token was not checked: more than "
        "0.5 tokens a second to verify (--metrics-auth-qps); retry later")
    assert len(cache) == 0
    assert authorizer.api.user_agent.endswith(" metrics-auth")
