"""The runtime framework: TrainJob + runtime -> RuntimeInfo {RuntimePolicy, PodSets}."""

from trainjob.runtime.framework import build_runtime_info, validate_policies
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy, Totals, totals

__all__ = [
    "PodSet", "RuntimeInfo", "RuntimePolicy", "Totals", "build_runtime_info", "totals",
    "validate_policies",
]
