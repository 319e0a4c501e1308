"""What one caller can hold of a listener anyone may reach: its connections are served by
a fixed pool of threads (never a thread per connection), a connection that finds them all
busy waits a moment in a short line and is then closed unserved, and every connection ends
a few seconds after a thread took it up, whatever the caller does (a TLS handshake or
request headers sent a byte at a time hold a thread no longer than that)."""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

BUSY, DEADLINE = "busy", "deadline"


@dataclass(frozen=True)
class ConnectionLimits:
    """``threads`` connections served at once; ``waiting`` more accepted and held for at
    most ``wait_seconds`` until a thread is free (beyond either, closed unserved); each
    connection cut ``deadline_seconds`` after a thread took it up."""

    threads: int = 8
    waiting: int = 32
    wait_seconds: float = 1.0
    # A scrape (handshake, request, a few hundred kB of answer on a cluster network) takes
    # well under a second; Prometheus gives up after 10 s by default.
    deadline_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.threads < 1 or self.waiting < 1:
            raise ValueError(f"threads and waiting must be at least 1, got "
                             f"{self.threads} and {self.waiting}")
        if self.wait_seconds < 0 or self.deadline_seconds <= 0:
            raise ValueError(f"wait_seconds must be at least 0 and deadline_seconds more "
                             f"than 0, got {self.wait_seconds} and {self.deadline_seconds}")


class Deadlines:
    """One thread that cuts the connections whose deadline has passed (waiting in line, or
    being served): their socket is shut down (a duplicate of it, so that wrapping the
    original in TLS, which takes its file descriptor over, changes nothing), which ends any
    read or write blocked on it and tells the caller."""

    def __init__(self, name: str):
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._watched: dict[int, tuple[socket.socket, Callable[[], None] | None, float]] = {}
        self._ids = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-deadlines",
                                        daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, seconds: float,
              on_cut: Callable[[], None] | None = None) -> int:
        """Cut ``sock`` in ``seconds`` (then call ``on_cut``) unless ``release`` comes
        first; returns the ticket."""
        duplicate = sock.dup()
        ticket = next(self._ids)
        due = time.monotonic() + seconds
        with self._lock:
            self._watched[ticket] = (duplicate, on_cut, due)
            heapq.heappush(self._heap, (due, ticket))
            self._lock.notify()
        return ticket

    def postpone(self, ticket: int, seconds: float | None) -> bool:
        """Move the ticket's deadline to ``seconds`` from now (None: no deadline until the
        next postpone); False when its deadline had already cut it."""
        due = time.monotonic() + seconds if seconds is not None else float("inf")
        with self._lock:
            watched = self._watched.get(ticket)
            if watched is None:
                return False
            self._watched[ticket] = (watched[0], watched[1], due)
            if seconds is not None:
                heapq.heappush(self._heap, (due, ticket))
                self._lock.notify()
        return True

    def release(self, ticket: int) -> bool:
        """The connection is done; False when its deadline had already cut it."""
        with self._lock:
            watched = self._watched.pop(ticket, None)
        if watched is None:
            return False
        watched[0].close()
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    _, ticket = heapq.heappop(self._heap)
                    watched = self._watched.get(ticket)
                    # A postponed ticket has a later entry of its own in the heap.
                    if watched is not None and watched[2] <= now:
                        due.append(self._watched.pop(ticket))
                if not due:
                    # Released tickets stay in the heap until their time: at most one per
                    # connection accepted in the last deadline.
                    self._lock.wait(self._heap[0][0] - now if self._heap else None)
                    continue
            for duplicate, on_cut, _ in due:
                try:
                    duplicate.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # the caller has gone already
                duplicate.close()
                if on_cut is not None:
                    try:
                        on_cut()
                    except Exception:  # counting must not stop the cutting
                        log.exception("on_cut failed")


class ConnectionPool:
    """Serves accepted connections with ``serve(sock, address)`` on at most
    ``limits.threads`` threads; ``submit`` never blocks (the accept loop goes on accepting
    and closing). ``on_drop(reason)`` is told of each connection closed unserved (``busy``)
    or cut at its deadline (``deadline``)."""

    def __init__(self, limits: ConnectionLimits,
                 serve: Callable[[socket.socket, object], None],
                 on_drop: Callable[[str], None] | None = None, name: str = "listener"):
        self.limits = limits
        self._serve = serve
        self._on_drop = on_drop
        self._line: queue.Queue = queue.Queue(maxsize=limits.waiting)
        self._deadlines = Deadlines(name)
        self._serving = threading.local()  # the deadline ticket of the thread's connection
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(limits.threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, sock: socket.socket, address) -> bool:
        """Hand over an accepted connection; False (and the connection closed) when the
        line is full. One that waits in line longer than ``wait_seconds`` is shut down then,
        not when a thread comes to it: its caller learns at once."""
        ticket = self._deadlines.watch(sock, self.limits.wait_seconds,
                                       lambda: self._told(BUSY))
        try:
            self._line.put_nowait((sock, address, ticket))
            return True
        except queue.Full:
            self._deadlines.release(ticket)
            self._drop(sock, BUSY)
            return False

    def set_deadline(self, seconds: float | None) -> bool:
        """From within ``serve``: the connection being served is cut ``seconds`` from now
        instead (None: not at all, until set again), e.g. a server that bounds a TLS
        handshake and the request's headers, then lets an authenticated answer stream for
        as long as it has its own bounds; False when the deadline had already cut it."""
        ticket = getattr(self._serving, "ticket", None)
        if ticket is None:
            raise RuntimeError("set_deadline is for the thread serving a connection")
        return self._deadlines.postpone(ticket, seconds)

    def close(self) -> None:
        """Stop the threads once they are done with what they serve; connections still in
        line are closed."""
        for _ in self._threads:
            while True:
                try:
                    self._line.put_nowait(None)
                    break
                except queue.Full:
                    self._close_one_waiting()
        self._deadlines.close()

    def _close_one_waiting(self) -> None:
        try:
            item = self._line.get_nowait()
        except queue.Empty:
            return
        if item is not None:
            _close(item[0])

    def _drop(self, sock: socket.socket, reason: str) -> None:
        _close(sock)
        self._told(reason)

    def _told(self, reason: str) -> None:
        if self._on_drop is not None:
            try:
                self._on_drop(reason)
            except Exception:  # counting must not stop serving
                log.exception("on_drop failed")

    def _work(self) -> None:
        while True:
            item = self._line.get()
            if item is None:
                return
            sock, address, waiting = item
            if not self._deadlines.release(waiting):  # shut down, and told, as its wait ended
                _close(sock)
                continue
            ticket = self._deadlines.watch(sock, self.limits.deadline_seconds,
                                           lambda: self._told(DEADLINE))
            self._serving.ticket = ticket
            try:
                self._serve(sock, address)
            except Exception:  # one connection must not end a thread
                log.debug("connection from %s failed", address, exc_info=True)
            finally:
                self._serving.ticket = None
                self._deadlines.release(ticket)
                _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
