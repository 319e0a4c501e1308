"""What to do next for one manager Workload in Kueue mode: a pure function of what is
observed (no API calls, no clock, no memory of its own).

``decide`` reads the Workload, its sizes (from its podSets), the registered workers, the
MultiKueue admission checks and the time, and returns exactly one action; the nominator
(``nominator``) performs it. When a worker is to be chosen it says ``Choose``: the
Placer weighs the workers' Node room and their Kueue's quota verdicts (under its lock, so
choices made at once see each other's reservations) and reserves the room of the one it
picks; ``nominate`` turns its answers into the next action.

What a decision needs from earlier rounds is in the Workload: the nomination
(``.status.nominatedClusterNames``), when this dispatcher wrote it (its managed-fields
entry), the workers that did not admit in time (``TRIED_ANNOTATION``) and why the Workload
could not be sized (``SIZED_CONDITION``). One input is not: ``said``, the last "waits"
message the nominator gave for the Workload, which it keeps in memory so that an Event is
emitted per change of reason rather than per round (a restart forgets it: the reason is
said once more).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller_kit.api_time import format_time

# The shared steps (a Workload gone, finished or being deleted is ``Forget``), read from
# here with Kueue mode's own (``kd.<Action>``).
from dispatcher.actions import Action as Action
from dispatcher.actions import Forget as Forget
from dispatcher.actions import Ignore as Ignore
from dispatcher.kueue import workloads as wl
from dispatcher.placement.chooser import message_shape
from dispatcher.placement.need import Need

Obj = dict[str, Any]

NO_WORKER_FITS = "NoWorkerFits"
# After every worker had its turn and none fits now: look again at once with the list
# cleared (capacity may have changed since the first of them was tried).
START_OVER_RETRY = 0.1


@dataclass(frozen=True)
class Settings:
    admission_timeout: float  # a nominated worker's Kueue must admit within this long
    field_manager: str  # the one this dispatcher writes nominations with


@dataclass(frozen=True)
class Sizes:
    """What the Workload asks of a worker (or why it cannot be sized): ``whole`` by its
    podSets' ``count``; ``least`` by their ``minCount`` when Kueue may admit it with fewer
    pods (partial admission), else None."""

    whole: Need | str
    least: Need | str | None = None


def sizes(workload: Obj, size: Callable[[Obj, bool], Need | str]) -> Sizes:
    """The Workload's ``Sizes``; ``size(workload, at_min_count)`` sizes it (the nominator
    passes ``workloads.podset_need`` behind a cache)."""
    least = size(workload, True) if wl.partially_admissible(workload) else None
    return Sizes(size(workload, False), least)


@dataclass(frozen=True)
class Fits:
    """The Placer's answer when a worker has room (Node and quota) for the need; it has
    reserved that room there. Otherwise its answer is why no worker has (a string)."""

    worker: str


Placed = Fits | str


# --- actions -----------------------------------------------------------------------------
# ``Action``, ``Ignore`` and ``Forget`` are the vocabulary both modes share
# (dispatcher/actions.py); the steps below are Kueue mode's own.

@dataclass(frozen=True)
class Idle(Action):
    """Kueue does not wait for this dispatcher now (it nominates, or does not run): look
    again later."""

    why: str = ""


@dataclass(frozen=True)
class Release(Action):
    """Not waiting for a worker and not admitted (evicted, or its quota reservation went):
    release the room its job holds, and nothing more."""

    release: bool = True
    why: str = ""


@dataclass(frozen=True)
class Hold(Action):
    """Keep the job's room held on ``worker`` (admitted there, or nominated and waiting for
    its Kueue); ``wait``: then look again after this long (None: its changes bring it
    back)."""

    worker: str = ""
    need: Need | None = None
    admitted: bool = False
    wait: float | None = None


@dataclass(frozen=True)
class Choose(Action):
    """Ask the Placer for a worker with room for ``need`` (else for ``least``, when Kueue may
    admit it with fewer pods), leaving out the workers in ``skip``.

    ``timed_out`` (the nominated workers did not admit in time): first release the room
    held there, say so, and record ``tried`` on the Workload. ``every_worker_tried``: every
    registered worker is in ``tried``, so when none has room the list starts over."""

    need: Need | None = None
    least: Need | None = None
    tried: tuple[str, ...] = ()
    skip: dict[str, str] = field(default_factory=dict)
    timed_out: str | None = None
    every_worker_tried: bool = False


@dataclass(frozen=True)
class Nominate(Action):
    """Write ``worker`` as the Workload's nomination (its room is reserved already), then
    wait ``wait`` seconds for the worker's Kueue to admit it."""

    worker: str = ""
    message: str = ""
    wait: float = 0.0


@dataclass(frozen=True)
class StartOver(Action):
    """Every worker was tried and none has room now: clear the tried list and decide again."""

    retry: float = START_OVER_RETRY


@dataclass(frozen=True)
class SayPending(Action):
    """The Workload waits: say why (an Event, a log line); ``shape`` is remembered so the
    same reason with other numbers is not said again."""

    reason: str = ""
    message: str = ""
    shape: str = ""


@dataclass(frozen=True)
class NominateEveryWorker(Action):
    """A Workload that cannot be sized: nominate ``names`` (every worker, as Kueue's
    all-at-once dispatcher would) and write ``condition`` (``SIZED_CONDITION`` False, why)
    in the same status write; ``added``: the names not nominated before."""

    names: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    message: str = ""
    condition: Obj = field(default_factory=dict)


# --- the table ---------------------------------------------------------------------------

def decide(workload: Obj | None, *, sized: Sizes | None, checks: set[str],
           workers: tuple[str, ...], now: float, settings: Settings,
           idle: str | None = None, said: str | None = None) -> Action:
    """The next step for ``workload`` (None: gone). ``sized``: its sizes (None only when
    it is gone); ``checks``: the names of the MultiKueue admission checks; ``workers``:
    the registered workers in configuration order; ``idle``: why Kueue does not wait for
    this dispatcher (None: it does); ``said``: the shape of the last "waits" message
    given for it."""
    if idle is not None:
        return Idle(why=idle)
    if workload is None:
        return Forget(why="the Workload is gone")
    if wl.finished(workload):
        return Forget(why="finished")
    if workload["metadata"].get("deletionTimestamp"):
        return Forget(why="being deleted")
    need = sized.whole
    if admitted_on := wl.cluster_name(workload):
        if isinstance(need, str):
            return Ignore(why=f"admitted on {admitted_on}; cannot be sized, so no room to hold")
        # Until its pods account for it; its quota is the worker Kueue's to count.
        return Hold(worker=admitted_on, need=need, admitted=True)
    waiting = wl.waiting(workload, checks)
    if waiting is None:
        return Release(why="not waiting for a worker: evicted, or its quota reservation went")
    if isinstance(need, str):
        return _unsizable(workload, waiting, need, workers, now, settings, said)
    tried = wl.tried(workload)
    timed_out = None
    timeout = settings.admission_timeout
    if waiting.nominated:
        since = wl.nominated_at(workload, settings.field_manager)
        if since is None:
            return Ignore(why="nominated by someone else: theirs to follow up")
        waited = now - since
        if waited < timeout:
            return Hold(worker=waiting.nominated[0], need=need, admitted=False,
                        wait=timeout - waited)
        tried += [name for name in waiting.nominated if name not in tried]
        timed_out = (f"worker {', '.join(waiting.nominated)} did not admit the Workload "
                     f"within {timeout:.0f}s; nominating the next")
    least = sized.least if isinstance(sized.least, Need) else None
    return Choose(need=need, least=least, tried=tuple(tried),
                  skip=dict.fromkeys(
                      tried, f"nominated before and did not admit within {timeout:.0f}s"),
                  timed_out=timed_out,
                  every_worker_tried=bool(tried and workers and set(workers) <= set(tried)))


def nominate(choose: Choose, whole: Placed, partial: Placed | None, *, settings: Settings,
             said: str | None = None) -> Action:
    """What follows the Placer's answers to ``choose``: ``whole`` for its need, ``partial``
    for its least (asked only when the whole need fits nowhere and there is a least)."""
    placed, with_fewer_pods = whole, False
    if isinstance(whole, str) and partial is not None and choose.least is not None:
        if isinstance(partial, str):
            placed = (f"{whole}; nor with partial admission ({choose.least.pods} of its "
                      f"{choose.need.pods} pods): {partial}")
        else:
            placed, with_fewer_pods = partial, True
    if isinstance(placed, str):
        if choose.every_worker_tried:
            return StartOver()
        # No room (NoWorkerFits), or the job's cluster selector matches no worker or does
        # not parse (the placer's answer carries that reason).
        return _pending(getattr(placed, "reason", NO_WORKER_FITS), str(placed), said)
    message = f"nominated worker cluster {placed.worker}"
    if with_fewer_pods:
        message += (f" (room for {choose.least.pods} of its {choose.need.pods} pods only: "
                    "the podSets' minCount, as Kueue's partial admission allows)")
    return Nominate(worker=placed.worker, message=message, wait=settings.admission_timeout)


def needs_another_look(workload: Obj, checks: set[str]) -> bool:
    """Whether a change of room on some worker may change what ``decide`` says for the
    Workload: it waits for a nomination, or was nominated to every worker because it could
    not be sized (the set of workers may have changed). One nominated by room waits for
    its worker's Kueue instead (its own changes and the admission timeout bring it back)."""
    waiting = wl.waiting(workload, checks)
    return waiting is not None and (not waiting.nominated or
                                    wl.sized_condition(workload) is not None)


def _unsizable(workload: Obj, waiting: wl.Waiting, why: str, workers: tuple[str, ...],
               now: float, settings: Settings, said: str | None) -> Action:
    """A Workload that cannot be sized: every worker nominated (the first whose Kueue
    admits it runs it), with why in its ``SIZED_CONDITION``. It has no admission timeout:
    there is no next worker to try."""
    if waiting.nominated and wl.nominated_at(workload, settings.field_manager) is None:
        return Ignore(why="nominated by someone else: theirs to follow up")
    if not workers:
        return _pending(wl.UNSIZABLE_REASON, f"cannot size the Workload: {why}; no worker "
                        "cluster is registered to nominate", said)
    names, left_out = workers[:wl.MAX_NOMINATED], workers[wl.MAX_NOMINATED:]
    message = (f"cannot size the Workload, so no worker is chosen by room: {why}; "
               f"nominated every worker cluster ({', '.join(names)}), as Kueue's "
               "all-at-once dispatcher would: the first whose Kueue admits it runs it")
    if left_out:
        message += (f" (Kueue takes at most {wl.MAX_NOMINATED} names: "
                    f"{', '.join(left_out)} left out)")
    shown = wl.sized_condition(workload) or {}
    if sorted(waiting.nominated) == sorted(names) and shown.get("message") == message:
        return Ignore(why="every worker nominated already")
    condition = {"type": wl.SIZED_CONDITION, "status": "False",
                 "reason": wl.UNSIZABLE_REASON, "message": message,
                 "lastTransitionTime": format_time(now),
                 "observedGeneration": workload["metadata"].get("generation") or 0}
    return NominateEveryWorker(names=tuple(names),
                               added=tuple(n for n in names if n not in waiting.nominated),
                               message=message, condition=condition)


def _pending(reason: str, message: str, said: str | None) -> Action:
    # Free amounts move with every pod: only a change of reason is worth an Event.
    shape = f"{reason}: {message_shape(message)}"
    if shape == said:
        return Ignore(why="waits for the reason said already")
    return SayPending(reason=reason, message=message, shape=shape)
