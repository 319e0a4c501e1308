"""Lease-based leader election (controller_kit.leader) against the manager's real apiserver:
acquire, standby, takeover after a crash, hand-over on release, no two leaders under churn,
and a Lease deleted under its holder."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.testing import eventually, holds_for, machine_load, stretched
from controller_kit.kubeclient import RateLimitedApiClient
from controller_kit.leader import LeaderElector

LEASE = "dispatcher-leader"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 2.0, 1.5, 0.3
TIMING = {"lease_duration": LEASE_DURATION, "renew_deadline": RENEW_DEADLINE,
          "retry_period": RETRY_PERIOD}


class Link(RateLimitedApiClient):
    """An API client whose connection to the apiserver can be cut: while cut, every request
    hangs for its whole timeout and then fails as a read timeout would, like a leader
    behind a network partition."""

    def __init__(self, configuration: client.Configuration):
        super().__init__(configuration, None)
        self.cut = threading.Event()

    def call_api(self, *args, **kwargs):
        if self.cut.is_set():
            timeout = kwargs.get("_request_timeout") or 5
            threading.Event().wait(timeout if isinstance(timeout, (int, float)) else 5)
            raise urllib3.exceptions.ReadTimeoutError(None, "lease", "partitioned (test)")
        return super().call_api(*args, **kwargs)


class Election:
    """Candidates for one Lease in the test's namespace, with a shared log of their
    callbacks: (monotonic time, identity, "started" | "stopped")."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.api = api
        self.namespace = namespace
        self.leases = client.CoordinationV1Api(api)
        self.candidates: list[LeaderElector] = []
        self.events: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    def candidate(self, identity: str, start: bool = True, api: client.ApiClient | None = None,
                  **callbacks) -> LeaderElector:
        elector = LeaderElector(
            api or self.api, self.namespace, LEASE, identity, **TIMING,
            on_started_leading=callbacks.get("on_started_leading",
                                             lambda: self._record(identity, "started")),
            on_stopped_leading=callbacks.get("on_stopped_leading",
                                             lambda: self._record(identity, "stopped")))
        self.candidates.append(elector)
        return elector.start() if start else elector

    def _record(self, identity: str, what: str) -> None:
        with self._lock:
            self.events.append((time.monotonic(), identity, what))

    def count(self, identity: str, what: str) -> int:
        with self._lock:
            return sum(1 for _, who, kind in self.events if (who, kind) == (identity, what))

    def lease(self) -> dict | None:
        """The Lease's spec as stored, None when there is no Lease."""
        try:
            response = self.leases.read_namespaced_lease(LEASE, self.namespace,
                                                         _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return json.loads(response.data)["spec"]

    def delete_lease(self) -> None:
        self.leases.delete_namespaced_lease(LEASE, self.namespace)

    def leaders(self) -> list[str]:
        return [c.identity for c in self.candidates if c.is_leader]

    def assert_terms_never_overlap(self) -> None:
        """Every on_started_leading comes after the previous term's on_stopped_leading."""
        with self._lock:
            events = sorted(self.events)
        current = None
        for at, who, kind in events:
            if kind == "started":
                assert current is None, (
                    f"{who} started leading at {at:.3f} while {current} was still leading; "
                    f"log: {events}")
                current = who
            else:
                assert current == who, f"{who} stopped a term it did not hold; log: {events}"
                current = None


@pytest.fixture
def election(multicluster, namespace):
    election = Election(multicluster.manager.api, namespace)
    yield election
    for candidate in election.candidates:
        candidate.stop(release=False)
    assert not any(c._thread and c._thread.is_alive() for c in election.candidates), \
        "an elector thread outlived stop()"


def _leader_is(election: Election, identity: str) -> dict:
    """Wait until ``identity`` leads and the Lease names it; return the Lease spec."""
    elector = next(c for c in election.candidates if c.identity == identity)
    _, spec = eventually(
        lambda: (elector.is_leader, election.lease()),
        lambda seen: seen[0] and seen[1] and seen[1].get("holderIdentity") == identity,
        expected=f"{identity} to lead and to hold Lease {LEASE}", timeout=10)
    return spec


def test_first_candidate_acquires_the_lease(election):
    a = election.candidate("a")
    spec = _leader_is(election, "a")
    assert spec["leaseTransitions"] == 0
    assert spec["leaseDurationSeconds"] == 2
    assert spec["acquireTime"] and spec["renewTime"]
    assert a.leader == "a"
    # The callback runs a moment after is_leader turns true, on the elector's thread.
    eventually(lambda: election.count("a", "started"), lambda n: n == 1,
               expected="a told once that it started leading")
    assert election.count("a", "stopped") == 0


def test_a_standby_waits_while_the_leader_renews(election):
    a = election.candidate("a")
    first = _leader_is(election, "a")
    b = election.candidate("b")
    eventually(lambda: b.leader, lambda leader: leader == "a",
               expected="b to observe a as the leader")

    renewals = []

    def sample():
        spec = election.lease()
        assert spec["holderIdentity"] == "a", f"holder changed while a renews: {spec}"
        assert a.is_leader and not b.is_leader, election.leaders()
        if not renewals or renewals[-1] != spec["renewTime"]:
            renewals.append(spec["renewTime"])

    # Well past the lease duration, so b would have taken an unrenewed Lease by now.
    holds_for(sample, seconds=LEASE_DURATION * 1.5, interval=0.05)
    assert len(renewals) >= 4, f"a renewed too rarely in {LEASE_DURATION * 1.5}s: {renewals}"
    assert renewals == sorted(renewals) and renewals[-1] > first["renewTime"], renewals
    assert election.lease()["acquireTime"] == first["acquireTime"]
    assert election.lease()["leaseTransitions"] == 0
    assert election.count("a", "started") == 1 and election.count("b", "started") == 0


def test_a_standby_takes_over_after_the_leader_crashes(election):
    a = election.candidate("a")
    _leader_is(election, "a")
    b = election.candidate("b")
    eventually(lambda: b.leader, lambda leader: leader == "a",
               expected="b to observe a as the leader")

    crashed = time.monotonic()
    a.stop(release=False)  # stops renewing; the Lease still names a
    assert not a.is_leader
    assert election.count("a", "stopped") == 1
    assert election.lease()["holderIdentity"] == "a"

    spec = _leader_is(election, "b")
    took = time.monotonic() - crashed
    # b last saw a renew at most one jittered retry before the crash and must then wait
    # out the whole lease duration, measured on its own clock (and then be given a core to
    # take it: later on a busy machine).
    assert LEASE_DURATION - 2.2 * RETRY_PERIOD - 0.1 < took < LEASE_DURATION + stretched(1.5), (
        f"b took over {took:.2f}s after the crash ({machine_load()})")
    assert spec["leaseTransitions"] == 1
    assert b.leader == "b" and not a.is_leader
    assert election.count("a", "stopped") == 1
    eventually(lambda: election.count("b", "started"), lambda n: n == 1,
               expected="b told once that it started leading")
    election.assert_terms_never_overlap()


def test_releasing_the_lease_hands_over_at_once(election):
    a = election.candidate("a")
    _leader_is(election, "a")
    b = election.candidate("b")
    eventually(lambda: b.leader, lambda leader: leader == "a",
               expected="b to observe a as the leader")

    released = time.monotonic()
    a.stop()  # release=True
    assert election.count("a", "stopped") == 1
    spec = _leader_is(election, "b")
    took = time.monotonic() - released
    assert took < LEASE_DURATION / 2, f"hand-over took {took:.2f}s, lease is {LEASE_DURATION}s"
    assert spec["leaseTransitions"] == 1
    election.assert_terms_never_overlap()


def test_never_two_leaders_under_random_stops_and_starts(election, multicluster):
    rng = random.Random(20240611)
    links = {name: Link(multicluster.manager.api.configuration) for name in ("a", "b", "c")}
    electors = [election.candidate(name, api=link) for name, link in links.items()]
    eventually(election.leaders, lambda leaders: len(leaders) == 1,
               expected="one of a, b, c to lead")

    done = threading.Event()
    actions: list[str] = []
    errors: list[BaseException] = []

    def churn():
        # Mostly at the leader: crash it (stop without release), stop it cleanly or cut its
        # network (it cannot renew and must step down by itself); otherwise restart a
        # stopped candidate or heal a cut one.
        try:
            while not done.wait(rng.uniform(0.1, 0.5)):
                leaders = [e for e in electors if e.is_leader]
                if leaders and rng.random() < 0.6:
                    target, move = leaders[0], rng.choice(["crash", "stop", "cut"])
                else:
                    target = rng.choice(electors)
                    running = target._thread is not None and target._thread.is_alive()
                    move = ("start" if not running else
                            "heal" if links[target.identity].cut.is_set() else None)
                if move is None:
                    continue
                actions.append(f"{move} {target.identity}")
                if move in ("crash", "stop"):
                    target.stop(release=move == "stop")
                elif move == "start":
                    target.start()
                elif move == "cut":
                    links[target.identity].cut.set()
                else:
                    links[target.identity].cut.clear()
        except BaseException as err:  # noqa: BLE001 - reported by the test thread
            errors.append(err)

    def sample():
        leaders = election.leaders()
        assert len(leaders) <= 1, f"two leaders at once: {leaders} after {actions}"

    churner = threading.Thread(target=churn, name="churn", daemon=True)
    churner.start()
    try:
        samples = holds_for(sample, seconds=6.0, interval=0.05)
    finally:
        done.set()
        churner.join(10)
    assert not errors, errors
    assert samples > 60
    handovers = sum(1 for _, _, kind in election.events if kind == "started") - 1
    assert handovers >= 2, f"leadership changed hands {handovers} times: {actions}"
    for link in links.values():
        link.cut.clear()
    for elector in electors:
        elector.stop(release=False)
    election.assert_terms_never_overlap()
    for elector in electors:  # every term that began also ended, once
        assert election.count(elector.identity, "started") == \
            election.count(elector.identity, "stopped"), (elector.identity, election.events)


def test_a_partitioned_leader_steps_down_before_a_standby_takes_over(election,
                                                                      multicluster):
    link = Link(multicluster.manager.api.configuration)
    a = election.candidate("a", api=link)
    _leader_is(election, "a")
    b = election.candidate("b")
    eventually(lambda: b.leader, lambda leader: leader == "a",
               expected="b to observe a as the leader")

    link.cut.set()
    cut = time.monotonic()
    a_stepped_down = b_took_over = None
    while b_took_over is None and time.monotonic() - cut < LEASE_DURATION + stretched(3):
        leaders = election.leaders()
        now = time.monotonic() - cut
        assert len(leaders) <= 1, f"a and b both lead {now:.2f}s after the partition"
        if a_stepped_down is None and "a" not in leaders:
            a_stepped_down = now
        if "b" in leaders:
            b_took_over = now
        threading.Event().wait(0.05)
    assert b_took_over is not None, "b never took over from the partitioned leader"
    # a's term ends renew_deadline after it sent its last successful renewal (at most one
    # retry period before the cut); b waits a whole lease duration from when it saw it.
    assert a_stepped_down <= RENEW_DEADLINE + 0.1, a_stepped_down
    assert b_took_over > a_stepped_down + (LEASE_DURATION - RENEW_DEADLINE) / 2, \
        (a_stepped_down, b_took_over)
    eventually(lambda: election.count("a", "stopped"), lambda n: n == 1,
               expected="a's on_stopped_leading once its renew deadline passed")
    election.assert_terms_never_overlap()

    link.cut.clear()  # the partition heals: a finds b leading and stays a standby
    eventually(lambda: a.leader, lambda leader: leader == "b",
               expected="a, reconnected, to observe b as the leader")

    def sample():
        assert b.is_leader and not a.is_leader, election.leaders()

    holds_for(sample, seconds=1.0, interval=0.05)
    assert election.lease()["holderIdentity"] == "b"
    assert election.count("a", "started") == 1


def test_a_lease_deleted_under_its_holder_is_recreated_by_it(election):
    a = election.candidate("a")
    _leader_is(election, "a")
    b = election.candidate("b")
    eventually(lambda: b.leader, lambda leader: leader == "a",
               expected="b to observe a as the leader")

    election.delete_lease()
    eventually(election.lease, lambda spec: spec is not None and spec["holderIdentity"] == "a",
               expected="a to re-create the deleted Lease", timeout=5)

    def sample():
        assert a.is_leader and not b.is_leader, election.leaders()
        assert election.lease()["holderIdentity"] == "a"

    # b saw a's lease just before it vanished: it must not create a new one under a.
    holds_for(sample, seconds=LEASE_DURATION * 1.5, interval=0.05)
    assert election.count("a", "started") == 1 and election.count("a", "stopped") == 0
    assert election.count("b", "started") == 0


def test_a_lease_deleted_with_its_holder_gone_is_recreated_by_a_standby(election):
    a = election.candidate("a")
    _leader_is(election, "a")
    b = election.candidate("b")
    eventually(lambda: b.leader, lambda leader: leader == "a",
               expected="b to observe a as the leader")

    crashed = time.monotonic()
    a.stop(release=False)
    election.delete_lease()
    spec = _leader_is(election, "b")
    took = time.monotonic() - crashed
    # Not at once: a's lease, as b last saw it, had to run out first.
    assert took > LEASE_DURATION - 2.2 * RETRY_PERIOD - 0.1, took
    assert spec["leaseTransitions"] == 0  # a new Lease
    election.assert_terms_never_overlap()


def test_callback_errors_are_logged_not_raised(election, caplog):
    def boom():
        raise RuntimeError("callback failed")

    a = election.candidate("a", on_started_leading=boom, on_stopped_leading=boom)
    first = _leader_is(election, "a")
    eventually(election.lease, lambda spec: spec["renewTime"] != first["renewTime"],
               expected="a to keep renewing after its callback raised")
    a.stop()
    assert "on_started_leading failed" in caplog.text
    assert "on_stopped_leading failed" in caplog.text
    assert election.lease().get("holderIdentity") is None  # released
