"""Who owns a TrainJob: the one reading of ``spec.managedBy`` both sides use.

Three values name the built-in training operator: unset (or empty, which the project's CRD
allows because it sets no default), the seed design's ``kubeflow.org/training-operator``, and
upstream Trainer's ``trainer.kubeflow.org/trainjob-controller``, which upstream's CRD fills
in when the field is left out. ``kueue.x-k8s.io/multikueue`` hands the job to the dispatcher.
Anything else belongs to a controller this project does not know, and is left alone.
"""

from __future__ import annotations

from typing import Any

from trainjob import constants as c

# Values that mean the built-in operator, besides unset/empty.
OPERATOR_VALUES = (c.MANAGED_BY_TRAINING_OPERATOR, c.MANAGED_BY_TRAINER_CONTROLLER)
# Every value admission accepts, besides unset/empty.
ALLOWED_VALUES = (*OPERATOR_VALUES, c.MANAGED_BY_MULTIKUEUE)


def managed_by(spec: Any) -> Any:
    """``managedBy`` of a TrainJob ``spec`` as the API returns it; "" when unset or null."""
    value = spec.get("managedBy") if isinstance(spec, dict) else None
    return "" if value is None else value


def operator_manages(value: Any) -> bool:
    """True when a ``spec.managedBy`` value gives the job to the built-in operator."""
    return value in (None, "") or value in OPERATOR_VALUES


def dispatcher_manages(value: Any) -> bool:
    """True when a ``spec.managedBy`` value gives the job to the multicluster dispatcher."""
    return value == c.MANAGED_BY_MULTIKUEUE


def dispatched(trainjob: Any) -> bool:
    """True when a TrainJob object (a dict as the API returns it) is the dispatcher's."""
    return bool(trainjob) and dispatcher_manages(managed_by(trainjob.get("spec")))


def allowed(value: Any) -> bool:
    """True for the values admission accepts: unset/empty or one of ``ALLOWED_VALUES``."""
    return value in (None, "") or value in ALLOWED_VALUES
