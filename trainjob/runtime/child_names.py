"""How long a TrainJob's name may be on a given runtime.

The JobSet is named like the TrainJob, and the JobSet controller derives every child's name
from it (JobSet v0.12.0):

* Job ``<jobset>-<replicatedJob>-<jobIndex>``: JobSet's webhook refuses a JobSet whose last
  Job name is not a DNS-1035 label (at most 63 characters); the Job controller also puts
  that name in a pod label, whose values stop at 63;
* pods of an Indexed Job (JobSet's default completion mode) with ``completions`` set:
  JobSet's webhook checks ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>``
  against the same 63;
* without ``completions`` the Job runs one pod, whose hostname ``<job>-0`` must be a
  DNS label (63);
* the headless Service is named after the JobSet unless the runtime sets
  ``network.subdomain`` (the TrainJob's own name check covers that one).

A name that does not leave room for these passes the TrainJob's admission and then fails
inside the JobSet controller, where the user does not look.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainjob.runtime.podsets import RuntimeInfo

LABEL_MAX = 63
RANDOM_SUFFIX = "-xxxxx"  # the 5 random characters generateName adds; JobSet's check counts them


@dataclass(frozen=True)
class ChildName:
    """The longest name of one kind of child, with ``{name}`` standing for the TrainJob's."""

    kind: str
    pattern: str

    @property
    def room(self) -> int:
        """The longest TrainJob name that keeps this child within the limit."""
        return LABEL_MAX - len(self.pattern.replace("{name}", ""))


def longest_child_names(info: RuntimeInfo) -> list[ChildName]:
    """For each replicated job, the longest Job name and pod name or hostname derived."""
    children = []
    for pod_set in info.pod_sets:
        spec = pod_set.job_spec
        job = f"{{name}}-{pod_set.name}-{pod_set.replicas - 1}"
        children.append(ChildName("Job", job))
        if spec.get("completionMode", "Indexed") != "Indexed":
            continue  # pods get generated names only, which the apiserver shortens itself
        completions = spec.get("completions")
        if isinstance(completions, int) and not isinstance(completions, bool):
            children.append(ChildName("pod", f"{job}-{completions - 1}{RANDOM_SUFFIX}"))
        else:
            children.append(ChildName("pod hostname", f"{job}-0"))
    return children


def name_room(info: RuntimeInfo) -> ChildName | None:
    """The child that leaves the TrainJob's name the least room (None without jobs)."""
    children = longest_child_names(info)
    return min(children, key=lambda child: child.room) if children else None
