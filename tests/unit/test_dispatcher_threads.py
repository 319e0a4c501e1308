"""The dispatcher's own threads under its manager (``controller_kit.manager``): the
scheduler's loop, the worker registry's threads (each worker's caches among them) and the
placer's warming thread are watched, so that one ending while the process runs stops it;
a worker removed on purpose is no death, and an interval job that raises is logged by
name while the scheduler goes on. Real Manager, real APScheduler, real informers against
a worker address nothing listens on (no apiserver needed: only the threads are looked at).
"""

from __future__ import annotations

import datetime
import logging
import threading
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from kubernetes import client

from clusters.controlplane import free_port
from clusters.testing import eventually, holds_for
from controller_kit.manager import Manager, Runnable, scheduler
from dispatcher.config import DispatcherConfig, StaticWorker
from dispatcher.controller import interval, worker_registry
from dispatcher.placement.placer import Placer
from dispatcher.workers.registry import WorkerRegistry

from manager_deaths import dead
from worker_fakes import Registry

WATCH = 0.05  # the manager looks at the threads this often


def background() -> BackgroundScheduler:
    return BackgroundScheduler(daemon=True, timezone=datetime.UTC)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_scheduler_loop_that_ends_is_named_by_readiness_and_stops_the_process(
        monkeypatch):
    loop = background()
    manager = Manager("dispatcher", watch_seconds=WATCH)
    manager.add(scheduler("scheduler", loop))
    manager.start(sync_timeout=5)
    try:
        assert manager.ready() == (True, "ok")

        def broken() -> float:
            raise RuntimeError("job store gone")
        # What APScheduler's loop calls at each wake-up fails: the loop's thread ends.
        monkeypatch.setattr(loop, "_process_jobs", broken)
        loop.wakeup()
        said = dead(manager, "readiness to name the scheduler once its loop ended")
        assert said == "scheduler ended: thread APScheduler raised RuntimeError: job store gone"
    finally:
        manager.stop()


def test_an_interval_job_that_raises_is_logged_by_name_and_runs_again(caplog):
    runs = []

    def sweep() -> None:
        runs.append(1)
        raise RuntimeError("worker-1 unreachable")
    loop = background()
    manager = Manager("dispatcher", watch_seconds=WATCH)
    manager.add(scheduler("scheduler", loop))
    manager.add(interval(loop, "garbage collection", sweep, 0.05), leader_only=True)
    manager.start(sync_timeout=5)
    try:
        eventually(lambda: len(runs), lambda count: count >= 2, timeout=10,
                   expected="the job run again after it raised")
        logged = [r for r in caplog.records if r.levelno == logging.ERROR
                  and 'Job "garbage collection (' in r.getMessage()
                  and "raised an exception" in r.getMessage()]
        assert logged, caplog.text
        assert logged[0].exc_info and str(logged[0].exc_info[1]) == "worker-1 unreachable"
        assert manager.ready() == (True, "ok") and not manager.stop_requested.is_set()
    finally:
        manager.stop()


# --- the worker registry --------------------------------------------------------------

@pytest.fixture
def registry(tmp_path: Path, monkeypatch) -> WorkerRegistry:
    """A registry with one worker of the static list, whose address nothing listens on:
    its caches keep trying (their threads run), its probes fail."""
    kubeconfig = tmp_path / "worker-1.kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: w, cluster: {{server: "https://127.0.0.1:{free_port()}"}}}}]
users: [{{name: w, user: {{token: t}}}}]
contexts: [{{name: w, context: {{cluster: w, user: w}}}}]
current-context: w
""")
    config = DispatcherConfig(workers=[StaticWorker(name="worker-1", kubeconfig=kubeconfig)])
    found = WorkerRegistry(client.ApiClient(), config, lambda *_: None, lambda _: None)
    # No manager apiserver here: its MultiKueueCluster and MultiKueueConfig caches are
    # not started (a static worker needs neither).
    monkeypatch.setattr(found.registrations, "start", lambda _timeout: None)
    return found


def registry_manager(registry: WorkerRegistry) -> Manager:
    manager = Manager("dispatcher", watch_seconds=WATCH)
    manager.add(worker_registry(registry))
    manager.start(sync_timeout=5)
    return manager


def worker_threads(registry: WorkerRegistry) -> list[threading.Thread]:
    return [thread for thread in registry.get("worker-1").threads() if thread is not None]


def test_a_worker_cache_thread_that_ends_stops_the_process(registry):
    manager = registry_manager(registry)
    try:
        assert len(worker_threads(registry)) == 6, "the worker's six caches run"
        assert any(t is registry.prober.thread and t.is_alive() for t in registry.threads())
        holds_for(manager.ready, lambda answer: answer == (True, "ok"), seconds=0.3,
                  interval=WATCH, expected="the registry running to leave the process ready")
        # Stopped behind the registry's back: its thread returns, the worker still listed.
        registry.get("worker-1").informers["nodes"].stop()
        said = dead(manager, "readiness to name the registry once a worker's cache ended")
        assert said == ("worker registry ended: thread informer-worker-1/nodes returned "
                        "while the process runs")
    finally:
        manager.stop()


def test_a_worker_removed_is_no_death(registry):
    manager = registry_manager(registry)
    try:
        threads = worker_threads(registry)
        assert threads and all(thread.is_alive() for thread in threads)
        registry.config.workers.clear()  # no registration names it any more
        registry.sync()
        assert registry.get("worker-1") is None
        for thread in threads:
            thread.join(5)
        assert not any(thread.is_alive() for thread in threads), "its threads ended"
        holds_for(lambda: (manager.ready(), manager.stop_requested.is_set()),
                  lambda seen: seen == ((True, "ok"), False), seconds=0.3, interval=WATCH,
                  expected="a worker removed on purpose to leave the process running")
    finally:
        manager.stop()


# --- the placer's warming thread --------------------------------------------------------

@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_warming_thread_may_end_but_not_raise(monkeypatch):
    placer = Placer(Registry(), "best-fit")
    manager = Manager("dispatcher", watch_seconds=WATCH)
    manager.add(Runnable("placer warming ahead", threads=placer.threads, may_finish=True))
    manager.start(sync_timeout=5)
    job = {"metadata": {"namespace": "ns", "name": "a"}, "spec": {}}
    try:
        placer.warm_ahead(job)  # nothing registered: nothing to warm, the thread ends
        warmer = placer.threads()[0]
        warmer.join(5)
        holds_for(manager.ready, lambda answer: answer == (True, "ok"), seconds=0.3,
                  interval=WATCH, expected="the warming thread that finished to be no death")

        def broken() -> None:
            raise RuntimeError("lock broken")
        monkeypatch.setattr(placer, "_warm_queued", broken)
        placer.warm_ahead(job)
        said = dead(manager, "readiness to name the warming once its thread raised")
        assert said == ("placer warming ahead ended: thread placer-warm-ahead raised "
                        "RuntimeError: lock broken")
    finally:
        manager.stop()
