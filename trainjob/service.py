"""Running a controller process: signals, the metrics/health server, the reconcile
workers, and an orderly stop. Shared by the dispatcher and the operator commands."""

from __future__ import annotations

import errno
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from trainjob import logs
from trainjob import controller_metrics as results
from trainjob.controller_metrics import ReconcileMetrics
from trainjob.gc_pauses import SWEEP_SECONDS, GcPauses
from trainjob.observability import ObservabilityServer, Route
from trainjob.workqueue import ShutDown, WorkQueue
from trainjob.required_apis import ClusterUnusable

log = logging.getLogger(__name__)


class Requeue(Exception):
    """Not an error: look at this key again after ``delay`` seconds."""

    def __init__(self, delay: float, why: str):
        super().__init__(why)
        self.delay = delay


class Controller(Protocol):
    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def ready(self) -> tuple[bool, str]: ...


class Server(Protocol):
    def stop(self) -> None: ...


def start_workers(queue: WorkQueue, reconcile: Callable[..., None], count: int, name: str,
                  on_error: Callable[[Hashable, Exception, bool, float], None],
                  observe: Callable[[float], None] | None = None,
                  metrics: ReconcileMetrics | None = None) -> list[threading.Thread]:
    """``count`` threads taking keys from ``queue`` and calling ``reconcile(*key)``. A
    failure is retried with per-key backoff, never dropped; ``on_error(key, err, first,
    delay)`` is told (``first`` once per streak of failures). Each reconcile's duration goes
    to ``observe``, and its result and duration to ``metrics``."""
    if metrics is not None:
        metrics.max_concurrent.set(count)

    def work() -> None:
        while True:
            try:
                key = queue.get()
            except ShutDown:
                return
            if metrics is not None:
                metrics.active.inc()
            started = time.perf_counter()
            result = results.SUCCESS
            namespace, name = key if isinstance(key, tuple) and len(key) == 2 else ("", key)
            try:
                with logs.context(namespace=namespace, name=name):
                    try:
                        reconcile(*key)
                        queue.forget(key)
                    except Requeue as again:
                        result = results.REQUEUE_AFTER if again.delay > 0 else results.REQUEUE
                        queue.add_after(key, again.delay)
                    except Exception as err:  # noqa: BLE001 - must not kill a worker
                        result = results.ERROR
                        first = queue.failures(key) == 0
                        on_error(key, err, first, queue.add_rate_limited(key))
            finally:
                elapsed = time.perf_counter() - started
                if observe is not None:
                    observe(elapsed)
                if metrics is not None:
                    metrics.finished(result, elapsed)
                    metrics.active.dec()
                queue.done(key)

    threads = [threading.Thread(target=work, name=f"{name}-{i}", daemon=True)
               for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


class ListenError(OSError):
    """A server could not listen; the message names the address and the flag to change."""

    def __init__(self, what: str, host: str, port: int, flag: str, err: OSError):
        reason = err.strerror or str(err)
        hint = (f"another process listens there; choose another port with {flag}"
                if err.errno == errno.EADDRINUSE else f"check {flag}")
        super().__init__(err.errno, f"cannot listen on {host}:{port} for {what}: {reason} "
                                    f"({hint})")


@dataclass(frozen=True)
class RoutesListener:
    """A listener of their own for a process's extra routes (what they are, for messages;
    where; the flag that sets the port)."""

    what: str
    host: str
    port: int
    flag: str


def serve(name: str, controller: Controller, registry: CollectorRegistry, host: str,
          port: int, extra_servers: Callable[[], list[Server]] | None = None,
          stop: threading.Event | None = None,
          failed: Callable[[], bool] | None = None,
          routes: dict[str, Route] | None = None,
          routes_listener: RoutesListener | None = None,
          gc_sweep_seconds: float = SWEEP_SECONDS) -> int:
    """Serve metrics and health, and ``routes`` (on the same server, or on
    ``routes_listener``), start ``controller`` (then ``extra_servers``), run until
    SIGINT/SIGTERM or until ``stop`` is set by someone else, then stop everything in
    reverse order; the interpreter's frozen objects are swept every ``gc_sweep_seconds``
    (0: never; trainjob/gc_pauses.py). Returns the exit code (1 when ``failed()`` says the
    stop was a failure, e.g. lost leadership)."""
    stop = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # Before the caches fill: they are most of what a full collection would walk, again
    # and again (trainjob/gc_pauses.py).
    collector = GcPauses(registry, gc_sweep_seconds).install()
    servers: list[Server] = []
    shared = routes if routes_listener is None else None
    try:
        try:
            observability = ObservabilityServer(port, registry, controller.ready, host=host,
                                                routes=shared).start()
        except OSError as err:
            raise ListenError("metrics and health" + (" and the dashboard" if shared else ""),
                              host, port, "--metrics-port", err) from err
        servers.append(observability)
        if routes and routes_listener is not None:
            listener = routes_listener
            try:
                own = ObservabilityServer(listener.port, None, None, host=listener.host,
                                          routes=routes).start()
            except OSError as err:
                raise ListenError(listener.what, listener.host, listener.port, listener.flag,
                                  err) from err
            servers.append(own)
            log.info("%s on http://%s:%d/", listener.what, listener.host, own.port)
        controller.start()
        # The caches have synced (reconciles may have begun): freeze what they hold.
        collector.sweep()
        servers.extend(extra_servers() if extra_servers else [])
        log.info("%s running; metrics on http://%s:%d/metrics", name, host, observability.port)
        stop.wait()
    except ListenError as err:
        print(f"error: {err.strerror}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError, ClusterUnusable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        for server in reversed(servers):
            server.stop()
        controller.stop()
        collector.uninstall()
    if failed is not None and failed():
        log.error("%s stopped after a failure", name)
        return 1
    log.info("%s stopped", name)
    return 0
