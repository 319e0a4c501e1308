"""A job's priority for the waiting line (``waiting_line``): the value of the PriorityClass
its pods ask for, read from the manager's PriorityClasses (scheduling.k8s.io/v1).

The class name comes from the pod templates the PodSet computation builds
(``Need.priority_classes``: the runtime's, after the job's runtimePatches and
podSpecOverrides; the CRD lets neither of those set priorityClassName today, so in practice
the runtime names it). Values as Kubernetes' Priority admission gives them to pods:

* a pod template naming a class gets that class's value;
* one naming none gets the value of the class marked ``globalDefault`` (the lowest, if a
  race left several marked), else 0;
* a named class the manager does not have counts 0: the manager cannot know it (the
  worker's admission will refuse such pods, or give them the worker's value), and guessing
  high would let a typo jump the line.

A job's priority is the highest of its pods': its replicated jobs may name different
classes (an initializer and a trainer), and the job holds room for all of them at once.
The manager's classes are read because the line is the manager's: the same class on two
workers may hold different values, and a job's place must not depend on where it might go.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from controller_kit.informer import Informer

GLOBAL_DEFAULT = "globalDefault"


class PriorityClasses:
    """The manager's PriorityClasses by name, from an informer (``None``: none known)."""

    def __init__(self, informer: Informer | None = None):
        self.informer = informer
        self._lock = threading.Lock()
        self._default: tuple[str, int] | None = None
        self._default_known = False
        if informer is not None:
            informer.add_handler(self._changed)

    def _changed(self, _kind: str, _old: dict | None, _new: dict | None) -> None:
        with self._lock:
            self._default_known = False

    def _classes(self) -> list[dict]:
        return self.informer.list() if self.informer is not None else []

    def value(self, name: str) -> int | None:
        """The value of the class ``name``, or None when the manager has no such class."""
        found = self.informer.get("", name) if self.informer is not None else None
        return _value(found) if found is not None else None

    def global_default(self) -> tuple[str, int] | None:
        """(name, value) of the class pods naming none get, or None."""
        with self._lock:
            if not self._default_known:
                marked = [(_value(obj), obj["metadata"]["name"]) for obj in self._classes()
                          if obj.get(GLOBAL_DEFAULT)]
                self._default = min(marked)[::-1] if marked else None
                self._default_known = True
            return self._default

    def job_priority(self, class_names: Iterable[str]) -> tuple[int, str]:
        """(priority, the class it comes from, "" for none) of a job whose pod templates
        name ``class_names`` ("" for a template that names none)."""
        best: tuple[int, str] | None = None
        for name in class_names:
            if name:
                found = self.value(name)
                candidate = (found if found is not None else 0, name)
            else:
                default = self.global_default()
                candidate = (default[1], default[0]) if default else (0, "")
            if best is None or candidate[0] > best[0]:
                best = candidate
        return best or (0, "")


def _value(obj: dict) -> int:
    try:
        return int(obj.get("value") or 0)
    except (TypeError, ValueError):
        return 0
