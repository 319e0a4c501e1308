"""What a plug-in may contribute to resolving a runtime, modelled on upstream Trainer's
framework extension points. A plug-in is an object with a ``name``, an ``enabled(policy)``
test and any of these methods; the framework calls each present method in its phase:

* ``enforce_ml_policy(info, job)``: the ML policy's part of the pods (counts, env, ports,
  volumes), in registration order;
* ``enforce_pod_group_policy(info, job)``: pod labels and annotations for gang scheduling;
* ``build(info, job) -> list[ExtraObject]``: objects the job needs beside its JobSet
  (Secrets, ConfigMaps, PodGroups); the operator owns them by the TrainJob;
* ``validate(info, job) -> list[(field path, reason[, kind])]``: what the plug-in refuses
  in a TrainJob (the admission webhook asks); the kind is a ``field.ErrorType`` such as
  ``FORBIDDEN``, ``INVALID`` when left out.

Each plug-in owns its fields of the runtime's policy and the objects it builds; the core
knows none of them by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trainjob.runtime.podsets import RuntimePolicy

Problems = list[tuple[str, str] | tuple[str, str, str]]
# The kinds of refusal a plug-in may give besides the default (upstream's field.ErrorType).
INVALID = "Invalid"
FORBIDDEN = "Forbidden"


class Plugin(Protocol):
    """The one method every plug-in has; the extension-point methods are optional."""

    name: str

    def enabled(self, policy: RuntimePolicy) -> bool:
        """Whether this plug-in takes part for a runtime with ``policy``."""


@dataclass
class ExtraObject:
    """An object a plug-in builds beside the JobSet. ``body`` has no ownerReferences (the
    operator adds the TrainJob). With ``make_content`` the object is created once, with the
    fields that function returns added (e.g. fresh key material), and never updated;
    otherwise it is applied like the JobSet."""

    body: dict[str, Any]
    plural: str
    make_content: Callable[[], dict[str, Any]] | None = None

    @property
    def create_only(self) -> bool:
        return self.make_content is not None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.body["apiVersion"], self.body["kind"], self.body["metadata"]["name"]

    def describe(self) -> str:
        meta = self.body["metadata"]
        return f"{self.body['kind']} {meta.get('namespace')}/{meta['name']}"
