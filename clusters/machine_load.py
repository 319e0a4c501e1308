"""How busy the machine is, and deadlines that move out as far as that makes things late.

A wait for something that must happen (a first reconcile, a controller ready, a webhook
called) is given the seconds an idle machine needs; on a shared machine (the other pytest
process running kind's clusters, a build) every process gets only its share of a core, and
the same step comes later without anything hanging. Such a deadline, once reached, is moved
out by the load average per CPU: a longer ceiling costs nothing when the event comes."""

from __future__ import annotations

import os
import time

# The most a window whose length costs time (a ``holds_for`` that asks to stretch) or whose
# length is itself a limit (the bench smoke tests') is stretched by the load.
MOST_STRETCH = 4.0
# The most a deadline on an event that must come is stretched: at 8 runnable processes per
# CPU each gets an eighth of a core (a loaded two-core machine was seen at a load of 13-21);
# past that, something hangs.
MOST_WAIT_STRETCH = 8.0


def load_stretch(most: float = MOST_STRETCH) -> float:
    """How much longer than on an idle machine a step may take now: the load average per
    CPU (the higher of the last 1 and 5 minutes) where that is above 1, at most ``most``."""
    per_cpu = max(os.getloadavg()[:2]) / (os.cpu_count() or 1)
    return min(most, max(1.0, per_cpu))


def machine_load() -> str:
    """The machine's load, for a failure message: was it waiting on a busy machine?"""
    one, five, fifteen = os.getloadavg()
    return (f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} "
            "CPUs")


def stretched(seconds: float) -> float:
    """``seconds`` of an idle machine, as long as the machine is busy now (``load_stretch``)."""
    return seconds * load_stretch()


class Deadline:
    """``seconds`` of an idle machine from now. Once they have passed, the deadline moves
    out as far as the load stretches them (``load_stretch(most)``, read then; it never moves
    back in), so a wait polling ``passed()`` lasts longer only when the machine is busy."""

    def __init__(self, seconds: float, most: float = MOST_WAIT_STRETCH,
                 clock=time.monotonic):
        self.seconds = seconds
        self.most = most
        self.clock = clock  # a test passes its own, to move time without waiting
        self.started = clock()
        self.limit = seconds

    def elapsed(self) -> float:
        return self.clock() - self.started

    def passed(self) -> bool:
        elapsed = self.elapsed()
        if elapsed < self.limit:
            return False
        self.limit = max(self.limit, self.seconds * load_stretch(self.most))
        return elapsed >= self.limit

    def waited(self) -> str:
        """How long the wait lasted against its idle-machine seconds, with the load: for the
        failure message of a wait that gave up."""
        elapsed = self.elapsed()
        span = f"{elapsed:.1f}s, stretched from {self.seconds:.1f}s" \
            if elapsed > self.seconds * 1.05 else f"{self.seconds:.1f}s"
        return f"{span} ({machine_load()})"
