"""Run an action once for a burst of triggers.

A namespace deleted on a worker frees its pods one watch event at a time; each event says
"room may have freed" and each would otherwise send every waiting job through placement
again. Gathering the triggers of a short window into one run keeps that work proportional
to the bursts, not to the pods in them, for a delay no waiting job notices.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# Changes of room within this window send the jobs (or Workloads) that wait for room
# through placement once.
ROOM_WINDOW_SECONDS = 0.1


class Coalesced:
    def __init__(self, action: Callable[[], None], window: float):
        self._action = action
        self._window = window
        self._lock = threading.Lock()
        self._armed = False

    def __call__(self) -> None:
        """Run the action ``window`` seconds from the first trigger not yet served."""
        with self._lock:
            if self._armed:
                return
            self._armed = True
        timer = threading.Timer(self._window, self._run)
        timer.daemon = True
        timer.start()

    def _run(self) -> None:
        # Disarmed before the action: a trigger that arrives while it runs is served by a
        # run of its own, so no change of room goes unseen.
        with self._lock:
            self._armed = False
        try:
            self._action()
        except Exception:  # a timer thread has no caller to raise to
            log.exception("coalesced %s failed", getattr(self._action, "__name__", "action"))
