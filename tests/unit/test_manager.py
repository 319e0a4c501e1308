"""The controller lifecycle (controller_kit.manager) without leader election: start order,
waiting for what must sync, reverse stop, the readiness text, failing runnables, a
runnable that dies while the process runs (readiness, log, Event, the process's exit
through ``service.serve``), and one Event per streak of reconcile failures. Leadership
against a real apiserver is in tests/trainjob/test_manager_leadership.py."""

from __future__ import annotations

import logging
import signal
import threading
import urllib.request

import pytest

from clusters.controlplane import free_port
from clusters.testing import eventually, holds_for
from controller_kit import service as service_module
from controller_kit.listeners import Listeners
from controller_kit.manager import (
    RUNNABLE_FAILED,
    FailureEvents,
    Manager,
    Runnable,
    cache,
    reconcile_workers,
)
from controller_kit.service import serve
from controller_kit.workqueue import WorkQueue

from manager_deaths import dead


class Journal:
    """What the runnables did, in order: ("start" | "stop", name)."""

    def __init__(self):
        self.entries: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def runnable(self, name: str, synced=None, required: bool = True, fail: bool = False):
        def start(_seconds_left: float) -> None:
            with self._lock:
                self.entries.append(("start", name))
            if fail:
                raise RuntimeError(f"{name} cannot start")

        def stop() -> None:
            with self._lock:
                self.entries.append(("stop", name))
        return Runnable(name, start=start, stop=stop, synced=synced, required=required)

    def of(self, what: str) -> list[str]:
        with self._lock:
            return [name for kind, name in self.entries if kind == what]


class Flag:
    """A cache stand-in: synced once ``synced`` is set (by the test, or at start)."""

    def __init__(self, sync_at_start: bool = True):
        self.synced = threading.Event()
        self._sync_at_start = sync_at_start
        self.stopped = False

    def start(self):
        if self._sync_at_start:
            self.synced.set()
        return self

    def stop(self) -> None:
        self.stopped = True


def test_starts_in_order_leader_only_last_and_stops_in_reverse():
    journal = Journal()
    manager = Manager("test")
    manager.add(journal.runnable("caches", synced=lambda: True))
    manager.add(journal.runnable("workers"), leader_only=True)
    manager.add(journal.runnable("server"))
    manager.add(journal.runnable("first pass"), leader_only=True)
    assert not manager.leading
    manager.start(sync_timeout=5)
    assert journal.of("start") == ["caches", "server", "workers", "first pass"]
    assert manager.leading, "without election the workers' start makes it the writer"
    manager.stop()
    assert journal.of("stop") == ["first pass", "workers", "server", "caches"]
    assert not manager.failed()


def test_the_next_runnable_waits_for_the_cache_before_it_and_readiness_names_it():
    slow = Flag(sync_at_start=False)
    journal = Journal()
    manager = Manager("test")
    manager.add(cache("TrainJob cache", Flag()))
    manager.add(cache("JobSet cache", slow))
    manager.add(journal.runnable("workers"), leader_only=True)
    manager.add_check(lambda: "webhook not serving yet")
    assert manager.ready() == (False, "TrainJob cache not synced")
    starting = threading.Thread(target=manager.start, kwargs={"sync_timeout": 30})
    starting.start()
    try:
        eventually(manager.ready, lambda answer: answer == (False, "JobSet cache not synced"),
                   timeout=5, expected="the first cache synced, the second named as not")
        assert journal.of("start") == [], "workers started before every cache synced"
        slow.synced.set()
        starting.join(10)
        assert not starting.is_alive(), "start did not return once the caches synced"
        assert journal.of("start") == ["workers"]
        # The caches are in: the extra check speaks next, then nothing stands against it.
        assert manager.ready() == (False, "webhook not serving yet")
    finally:
        slow.synced.set()
        starting.join(10)
        manager.stop()
    assert slow.stopped


def test_ready_without_election_is_ok():
    manager = Manager("test")
    manager.add(cache("cache", Flag()))
    manager.start(sync_timeout=5)
    try:
        assert manager.ready() == (True, "ok")
    finally:
        manager.stop()


def test_a_required_runnable_not_synced_fails_the_start_by_name_and_a_stop_undoes_it():
    journal = Journal()
    manager = Manager("test")
    manager.add(journal.runnable("apis"))
    manager.add(journal.runnable("stuck cache", synced=lambda: False))
    manager.add(journal.runnable("after"))
    with pytest.raises(TimeoutError, match="stuck cache not synced after 0.2s"):
        manager.start(sync_timeout=0.2)
    assert journal.of("start") == ["apis", "stuck cache"]
    manager.stop()
    assert journal.of("stop") == ["stuck cache", "apis"]


def test_one_not_required_is_waited_for_then_left_out_of_readiness():
    journal = Journal()
    manager = Manager("test")
    manager.add(journal.runnable("worker caches", synced=lambda: False, required=False))
    manager.add(journal.runnable("workers"), leader_only=True)
    manager.start(sync_timeout=0.2)
    try:
        assert journal.of("start") == ["worker caches", "workers"]
        assert manager.ready() == (True, "ok")
    finally:
        manager.stop()


def test_a_runnable_that_fails_to_start_stops_the_start_and_only_what_started_stops():
    journal = Journal()
    manager = Manager("test")
    manager.add(journal.runnable("first"))
    manager.add(journal.runnable("broken", fail=True))
    manager.add(journal.runnable("never"))
    manager.add(journal.runnable("workers"), leader_only=True)
    with pytest.raises(RuntimeError, match="broken cannot start"):
        manager.start(sync_timeout=5)
    manager.stop()
    assert journal.of("start") == ["first", "broken"]
    assert journal.of("stop") == ["broken", "first"]


def test_a_leader_only_runnable_that_fails_ends_the_term_and_the_process(caplog):
    journal = Journal()
    manager = Manager("test")
    manager.add(journal.runnable("cache"))
    manager.add(journal.runnable("workers"), leader_only=True)
    manager.add(journal.runnable("broken", fail=True), leader_only=True)
    manager.add(journal.runnable("never"), leader_only=True)
    manager.start(sync_timeout=5)
    assert manager.stop_requested.is_set() and manager.failed()
    assert "broken failed to start; stopping" in caplog.text
    # The term's runnables stopped at once (no writes from a half-started leader).
    assert journal.of("stop") == ["broken", "workers"]
    manager.stop()
    assert journal.of("stop") == ["broken", "workers", "cache"]


def test_a_stop_asked_for_while_starting_ends_the_start_quietly():
    journal = Journal()
    manager = Manager("test")
    manager.add(journal.runnable("cache", synced=lambda: False))
    manager.add(journal.runnable("workers"), leader_only=True)
    starting = threading.Thread(target=manager.start, kwargs={"sync_timeout": 60})
    starting.start()
    eventually(lambda: journal.of("start"), lambda started: started == ["cache"], timeout=5,
               expected="the cache started and waited for")
    manager.stop_requested.set()  # what SIGTERM does
    starting.join(5)
    assert not starting.is_alive(), "a stop request did not end the wait for a cache"
    manager.stop()
    assert journal.of("start") == ["cache"] and journal.of("stop") == ["cache"]
    assert not manager.failed()


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str, str, str]] = []
        self.flushed = 0  # Events queued when flush() was last asked for

    def event(self, obj: dict, kind: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], kind, reason, message))

    def flush(self, timeout: float) -> None:
        self.flushed = len(self.events)


def test_a_failure_streak_is_one_event_and_every_failure_is_counted():
    job = {"metadata": {"namespace": "team-a", "name": "train"}}
    recorder, counted = Recorder(), []
    attempts, done = [], threading.Event()

    def reconcile(namespace: str, name: str) -> None:
        attempts.append(name)
        if len(attempts) < 4:
            raise RuntimeError("the apiserver said no")
        done.set()

    queue = WorkQueue(base_delay=0.001, max_delay=0.01)
    report = FailureEvents("TrainJob", "reconcile", "ReconcileError",
                           lambda ns, name: job if (ns, name) == ("team-a", "train") else None,
                           recorder, lambda: counted.append(1))
    manager = Manager("test")
    manager.add(reconcile_workers("reconcile", queue, reconcile, 2, report), leader_only=True)
    manager.start(sync_timeout=5)
    try:
        queue.add(("team-a", "train"))
        assert done.wait(10), f"never reconciled after the failures; attempts: {attempts}"
        assert len(counted) == 3
        assert recorder.events == [("train", "Warning", "ReconcileError",
                                    "reconcile failed, retrying with backoff: "
                                    "RuntimeError: the apiserver said no")]
    finally:
        manager.stop()


# --- a runnable that dies -----------------------------------------------------------------

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"namespace": "operator-system", "name": "operator-0", "uid": "u-1"}}


class Threaded:
    """A runnable doing its work in a thread of its own, which ends when ``end`` is set:
    raising ``error`` if given, else returning."""

    def __init__(self, name: str, journal: Journal, error: Exception | None = None,
                 may_finish: bool = False):
        self.name, self.journal, self.error = name, journal, error
        self.end = threading.Event()
        self.thread: threading.Thread | None = None
        self.may_finish = may_finish

    def _work(self) -> None:
        self.end.wait()
        if self.error is not None:
            raise self.error

    def runnable(self) -> Runnable:
        def start(_: float) -> None:
            self.journal.entries.append(("start", self.name))
            self.thread = threading.Thread(target=self._work, name=f"{self.name}-thread",
                                           daemon=True)
            self.thread.start()

        def stop() -> None:
            self.journal.entries.append(("stop", self.name))
        return Runnable(self.name, start=start, stop=stop, threads=lambda: [self.thread],
                        may_finish=self.may_finish)


def _dying_manager(recorder: Recorder | None = None):
    journal = Journal()
    webhook = Threaded("webhook listeners", journal, RuntimeError("socket gone"))
    manager = Manager("test", recorder=recorder, involved=POD, watch_seconds=0.05)
    manager.add(journal.runnable("cache", synced=lambda: True))
    manager.add(webhook.runnable())
    manager.add(journal.runnable("workers"), leader_only=True)
    return manager, webhook, journal


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_runnable_whose_thread_raises_is_named_logged_told_and_ends_the_process(caplog):
    recorder = Recorder()
    manager, webhook, journal = _dying_manager(recorder)
    manager.start(sync_timeout=5)
    try:
        assert manager.ready() == (True, "ok")
        webhook.end.set()
        eventually(manager.stop_requested.is_set, bool, timeout=10,
                   expected="the manager to ask the process to stop once the thread died")
        said = "webhook listeners ended: thread webhook listeners-thread raised " \
               "RuntimeError: socket gone"
        assert manager.ready() == (False, said)
        assert manager.failed() and manager.death == said
        logged = [r for r in caplog.records if said in r.getMessage()]
        assert logged and logged[0].levelno == logging.ERROR, caplog.text
        assert logged[0].exc_info and logged[0].exc_info[1] is webhook.error, \
            "the death was logged without its exception"
        assert recorder.events == [("operator-0", "Warning", RUNNABLE_FAILED,
                                    f"{said}; the process stops to be started again")]
    finally:
        manager.stop()
    assert journal.of("stop") == ["workers", "webhook listeners", "cache"]
    assert recorder.flushed == 1, "the stop did not wait for the death's Event"


def test_a_thread_that_returns_while_the_process_runs_is_a_death_too():
    manager, webhook, journal = _dying_manager()
    webhook.error = None
    manager.start(sync_timeout=5)
    try:
        webhook.end.set()
        dead(manager, "readiness to fail once the thread returned")
        assert manager.ready() == (False, "webhook listeners ended: thread webhook "
                                          "listeners-thread returned while the process runs")
        assert manager.stop_requested.is_set() and manager.failed()
    finally:
        manager.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_one_that_may_finish_may_return_but_not_raise():
    journal = Journal()
    done = Threaded("one-shot", journal, may_finish=True)
    broken = Threaded("other one-shot", journal, ValueError("bad input"), may_finish=True)
    manager = Manager("test", watch_seconds=0.05)
    manager.add(done.runnable())
    manager.add(broken.runnable())
    manager.start(sync_timeout=5)
    try:
        done.end.set()
        done.thread.join(5)
        holds_for(manager.ready, lambda answer: answer == (True, "ok"), seconds=0.3,
                  interval=0.05, expected="a one-shot that finished to leave it ready")
        assert not manager.stop_requested.is_set()
        broken.end.set()
        eventually(manager.ready, lambda answer: not answer[0], timeout=10,
                   expected="a one-shot that raised to be a death")
        assert manager.ready()[1] == ("other one-shot ended: thread other one-shot-thread "
                                      "raised ValueError: bad input")
    finally:
        manager.stop()


def test_a_leader_only_runnable_that_dies_ends_the_term_and_the_process():
    journal = Journal()
    loop = Threaded("garbage collection", journal)
    manager = Manager("test", watch_seconds=0.05)
    manager.add(journal.runnable("cache"))
    manager.add(loop.runnable(), leader_only=True)
    manager.start(sync_timeout=5)
    try:
        loop.end.set()
        dead(manager, "readiness to name the leader-only runnable that died")
        assert manager.ready()[1] == ("garbage collection ended: thread garbage "
                                      "collection-thread returned while the process runs")
        assert manager.stop_requested.is_set() and manager.failed()
    finally:
        manager.stop()
    assert journal.of("stop") == ["garbage collection", "cache"]


def test_a_stop_is_no_death():
    manager, webhook, _ = _dying_manager()
    webhook.error = None
    manager.start(sync_timeout=5)
    manager.stop()  # the thread is left running: stopping it ends nothing unexpectedly
    webhook.end.set()
    webhook.thread.join(5)
    assert not manager.failed() and manager.death is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_serve_answers_ready_then_exits_non_zero_when_a_runnable_dies(caplog):
    manager, webhook, journal = _dying_manager()
    port = free_port()
    answers: list[tuple[int, str]] = []

    def readyz() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status, r.read().decode()
        except OSError as err:
            return 0, str(err)

    def probe_then_kill() -> None:
        answers.append(eventually(readyz, lambda answer: answer[0] == 200, timeout=20,
                                  expected="/readyz to answer 200 once started"))
        webhook.end.set()

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    prober = threading.Thread(target=probe_then_kill, daemon=True)
    prober.start()
    try:
        code = serve("test", manager, None, Listeners("127.0.0.1", port),
                     gc_sweep_seconds=0)
    finally:
        webhook.end.set()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    prober.join(5)
    assert answers == [(200, "ok")]
    assert code == 1, "a runnable's death must end the process with a failure"
    # Everything stopped, the listener last (it was the first runnable).
    assert journal.of("stop") == ["workers", "webhook listeners", "cache"]
    assert readyz()[0] == 0, "the listener still answers after the process's end"
    assert "stopped after a failure (webhook listeners ended: thread webhook " \
           "listeners-thread raised RuntimeError: socket gone)" in caplog.text


def test_a_stop_that_hangs_writes_every_thread_s_stack(monkeypatch, capfd):
    """A runnable whose stop does not return: the process says where it hangs (every
    thread's stack on stderr) well before the kubelet's grace period runs out."""
    monkeypatch.setattr(service_module, "STOP_REPORT_SECONDS", 0.2)
    seen: list[str] = []

    def stuck_stop() -> None:  # ends only once the stacks were written
        def written() -> str:
            seen.append(capfd.readouterr().err)
            return "".join(seen)
        eventually(written, lambda err: "stuck_stop" in err, timeout=20,
                   expected="the hanging stop's frame in the stacks on stderr")

    manager = Manager("test")
    # Started, it asks for the process's stop, as a signal would.
    manager.add(Runnable("stuck", start=lambda _: manager.stop_requested.set(),
                         stop=stuck_stop))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert serve("test", manager, None, Listeners("127.0.0.1", free_port()),
                     gc_sweep_seconds=0) == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert "Thread" in "".join(seen) and "stuck_stop" in "".join(seen)
