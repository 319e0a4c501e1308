"""The vocabulary both modes' decisions speak: an ``Action`` is the one next step a pure
``decide`` returns for one object, and its performer (the standalone reconciler, the Kueue
mode nominator) carries it out. Each mode adds the steps of its own in its own module
(``standalone/actions.py``, ``kueue/decisions.py``); the steps every mode has are here, so
that a step means the same in both.

A module of its own, importing nothing of the dispatcher: both modes import it, and it
adds no edge to the packages' import graph that could close a circle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    """One next step. ``release``: the step ends the job's claim on the room held for it
    on a worker, so the performer drops that hold before carrying the step out (a job that
    stops waiting, finishes or moves frees that room for the next decision)."""

    release: bool = False

    @property
    def name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Ignore(Action):
    """Nothing to do now (``why``, for the log): the object's next change brings it back."""

    why: str = ""


@dataclass(frozen=True)
class Forget(Action):
    """The object is gone (or done with): drop everything kept for it in memory, the room
    held for its job included."""

    why: str = ""
