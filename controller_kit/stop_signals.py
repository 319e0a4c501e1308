"""SIGINT and SIGTERM turned into a stop, whichever thread the kernel delivers them to.

A signal sent to a process goes to any one of its threads that does not block it. Python
runs a signal's handler only in the main thread, once it next runs Python code: a main
thread blocked in an untimed wait (a controller serving until it is told to stop) never
does when another thread took the signal, and the process ignores SIGTERM until the
kubelet's SIGKILL. A handler that sets a ``threading.Event`` is no way out either: it may
run inside that Event's own wait, while its lock is held, and wait for that lock forever.

So the handler does nothing; the interpreter's own C-level handler writes each signal's
number to a pipe (``signal.set_wakeup_fd``) in whatever thread caught it, and a thread of
ours that reads the pipe sets the stop.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While installed (``with``, from the main thread): SIGINT and SIGTERM set ``stop``.
    Leaving restores the handlers and wakeup fd that were there before."""

    def __init__(self, name: str, stop: threading.Event) -> None:
        self.name = name
        self.stop = stop
        self.received: list[signal.Signals] = []

    def __enter__(self) -> StopSignals:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._handlers = {sig: signal.signal(sig, lambda *_: None) for sig in STOP_SIGNALS}
        self._wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._relay, name="stop-signals", daemon=True)
        self._thread.start()
        return self

    def _relay(self) -> None:
        while chunk := os.read(self._read, 64):  # empty: the write end closed on exit
            for number in chunk:
                if number in STOP_SIGNALS:
                    self.received.append(signal.Signals(number))
                    log.info("%s stopping (%s)", self.name, signal.Signals(number).name)
                    self.stop.set()

    def __exit__(self, *_) -> None:
        signal.set_wakeup_fd(self._wakeup)
        for sig, handler in self._handlers.items():
            if handler is not None:  # None: not set from Python; nothing to give back
                signal.signal(sig, handler)
        os.close(self._write)
        self._thread.join()
        os.close(self._read)
