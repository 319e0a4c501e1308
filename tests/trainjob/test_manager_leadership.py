"""The controller lifecycle's leader election (controller_kit.manager) against the manager's
real apiserver: a standby's leader-only runnables start only after the leader's have
stopped (its workers finish before the Lease is given up), and a leader that loses its
Lease stops writing at once and asks the process to end, never to lead again. And the
Warning Event a runnable's death leaves on the process's own Pod, as kubectl shows it."""

from __future__ import annotations

import threading
import time

import urllib3
from kubernetes import client

from clusters.testing import eventually
from controller_kit.events import EventRecorder
from controller_kit.kubeclient import RateLimitedApiClient
from controller_kit.manager import RUNNABLE_FAILED, Lease, Manager, Runnable

TIMING = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.3}


class Link(RateLimitedApiClient):
    """An API client whose connection can be cut: while cut every request fails as a read
    timeout would (a leader behind a partition, without the wait)."""

    def __init__(self, configuration: client.Configuration):
        super().__init__(configuration, None)
        self.cut = threading.Event()

    def call_api(self, *args, **kwargs):
        if self.cut.is_set():
            raise urllib3.exceptions.ReadTimeoutError(None, "lease", "partitioned (test)")
        return super().call_api(*args, **kwargs)


class Timeline:
    def __init__(self):
        self.entries: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    def runnable(self, replica: str, name: str) -> Runnable:
        return Runnable(name, start=lambda _: self._add(replica, f"start {name}"),
                        stop=lambda: self._add(replica, f"stop {name}"))

    def _add(self, replica: str, what: str) -> None:
        with self._lock:
            self.entries.append((time.monotonic(), replica, what))

    def of(self, replica: str) -> list[str]:
        with self._lock:
            return [what for _, who, what in self.entries if who == replica]

    def at(self, replica: str, what: str) -> float:
        with self._lock:
            return next(at for at, who, done in self.entries if (who, done) == (replica, what))


def _replica(api, namespace: str, name: str, timeline: Timeline) -> Manager:
    manager = Manager(name, api=api, lease=Lease(namespace, "manager-test", **TIMING),
                      identity=name)
    manager.add(Runnable("cache", synced=lambda: True))
    manager.add(timeline.runnable(name, "workers"), leader_only=True)
    manager.add(timeline.runnable(name, "garbage collection"), leader_only=True)
    return manager


def test_a_standby_leads_only_after_the_leaders_workers_stopped(multicluster, namespace):
    timeline = Timeline()
    first = _replica(multicluster.manager.api, namespace, "first", timeline).start(10)
    second = None
    try:
        eventually(first.ready, lambda answer: answer == (True, "leader"), timeout=10,
                   expected="the first replica leading")
        second = _replica(multicluster.manager.api, namespace, "second", timeline).start(10)
        eventually(second.ready, lambda answer: answer == (True, "standby (leader: first)"),
                   timeout=10, expected="the second replica a ready standby naming the leader")
        assert timeline.of("second") == [], "a standby started leader-only runnables"
        first.stop()
        assert timeline.of("first") == ["start workers", "start garbage collection",
                                        "stop garbage collection", "stop workers"]
        eventually(lambda: timeline.of("second"), lambda seen: "start workers" in seen,
                   timeout=5, expected="the standby leading at once on the released Lease")
        assert timeline.at("second", "start workers") > timeline.at("first", "stop workers")
        assert not first.failed() and not first.stop_requested.is_set()
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_lost_lease_stops_the_workers_and_the_process_for_good(multicluster, namespace):
    timeline = Timeline()
    link = Link(multicluster.manager.api.configuration)
    leader = _replica(link, namespace, "leader", timeline).start(10)
    try:
        eventually(lambda: leader.leading, bool, timeout=10, expected="the replica leading")
        link.cut.set()
        eventually(leader.stop_requested.is_set, bool, timeout=10,
                   expected="the process asked to stop once the renew deadline passed")
        assert leader.lost_leadership.is_set() and leader.failed()
        assert timeline.of("leader") == ["start workers", "start garbage collection",
                                         "stop garbage collection", "stop workers"]
        link.cut.clear()
        # The elector goes on campaigning until the process stops; the Lease runs out and it
        # may take it again, but no term starts in a process that lost one.
        eventually(lambda: leader.elector.is_leader, bool, timeout=10,
                   expected="the elector holding the Lease again once the link is back")
        assert timeline.of("leader") == ["start workers", "start garbage collection",
                                         "stop garbage collection", "stop workers"]
    finally:
        leader.stop()


def test_a_runnable_that_dies_is_told_on_the_processs_pod(multicluster, namespace,
                                                          monkeypatch):
    api = multicluster.manager.api
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "controller-0"},
        "spec": {"containers": [{"name": "main", "image": "controller"}]}})
    # What the Deployment's downward API gives the process.
    monkeypatch.setenv("POD_NAME", "controller-0")
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    monkeypatch.setenv("POD_UID", pod.metadata.uid)
    end = threading.Event()
    worker = threading.Thread(target=end.wait, name="server-loop", daemon=True)
    manager = Manager("test", recorder=EventRecorder(api, "manager-test"), watch_seconds=0.05)
    manager.add(Runnable("server", start=lambda _: worker.start(), threads=lambda: [worker]))
    manager.start(10)
    try:
        end.set()  # its loop returns while the process runs
        eventually(manager.stop_requested.is_set, bool, timeout=10,
                   expected="the process asked to stop once the runnable's thread ended")
    finally:
        manager.stop()  # waits for the Event to be written

    def told() -> list[tuple[str, str, str]]:
        # As `kubectl describe pod` finds them: by the Pod's kind, name and UID.
        events = core.list_namespaced_event(namespace, field_selector=(
            f"involvedObject.kind=Pod,involvedObject.name=controller-0,"
            f"involvedObject.uid={pod.metadata.uid}")).items
        return [(e.type, e.reason, e.message) for e in events]
    eventually(told, lambda seen: seen == [
        ("Warning", RUNNABLE_FAILED, "server ended: thread server-loop returned while the "
         "process runs; the process stops to be started again")], timeout=10,
        expected="one RunnableFailed Warning Event on the process's Pod")
