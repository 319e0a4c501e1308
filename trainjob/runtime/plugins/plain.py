"""The plain policy: a runtime with neither torch nor mpi gets nothing extra."""

from __future__ import annotations

from trainjob.api import TrainJob
from trainjob.runtime.plugins import register
from trainjob.runtime.podsets import RuntimeInfo, RuntimePolicy


class PlainPolicy:
    name = "plain"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == "plain"

    def apply(self, info: RuntimeInfo, job: TrainJob) -> None:
        return None

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[tuple[str, str]]:
        return []


register(PlainPolicy())
