"""Building the remote copy (the mirror) of a manager TrainJob, the status the manager shows
for it, and telling whose a remote object is. Pure: the writes are ``remote_copies``'s,
the status copied back ``status_sync``'s."""

from __future__ import annotations

from typing import Any

from controller_kit.api_time import format_time
from dispatcher.placement import footprint
from trainjob import conditions
from trainjob import constants as c

# Manager-only annotations that must not travel to the worker.
_MANAGER_ONLY = (c.PLACEMENT_ANNOTATION, "kubectl.kubernetes.io/last-applied-configuration")


def build_remote(manager: dict[str, Any], origin: str, requests: dict[str, str],
                 pods: int) -> dict[str, Any]:
    """Same namespace and name, the manager's labels and annotations plus the origin label
    and the manager UID, the manager's spec without ``managedBy`` (so the worker's
    operator owns it). ``requests``/``pods`` record the footprint used for placement."""
    meta = manager["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k not in _MANAGER_ONLY}
    annotations[c.MANAGER_UID_ANNOTATION] = meta["uid"]
    footprint.record(annotations, requests, pods)
    # A shallow copy: only top-level fields change, and the body is only serialised.
    spec = dict(manager.get("spec") or {})
    spec.pop("managedBy", None)
    # The manager's Kueue keeps its scheduling decisions in its own runtime patch; a
    # worker's Kueue adds its own, and two entries of one manager are refused (as Kueue's
    # MultiKueue does, the copy goes without it).
    if "runtimePatches" in spec:
        spec["runtimePatches"] = [p for p in spec["runtimePatches"] or []
                                  if p.get("manager") != c.KUEUE_RUNTIME_PATCH_MANAGER]
        if not spec["runtimePatches"]:
            del spec["runtimePatches"]
    return {
        "apiVersion": c.TRAINER_API_VERSION,
        "kind": c.TRAINJOB_KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {**(meta.get("labels") or {}), c.MULTIKUEUE_ORIGIN_LABEL: origin},
            "annotations": annotations,
        },
        "spec": spec,
    }


def is_ours(remote: dict[str, Any], origin: str) -> bool:
    """A copy this dispatcher made: our origin label *and* the manager-UID annotation it
    writes. The only remote objects it may adopt, change or delete. The label alone is no
    proof: Kueue's MultiKueue puts the same label (default origin ``multikueue``) on the
    copies it makes."""
    meta = remote.get("metadata") or {}
    return (meta.get("labels") or {}).get(c.MULTIKUEUE_ORIGIN_LABEL) == origin and \
        bool((meta.get("annotations") or {}).get(c.MANAGER_UID_ANNOTATION))


def mirrors(remote: dict[str, Any], manager: dict[str, Any]) -> bool:
    """Ours and a copy of this very manager object (not of an earlier same-named one)."""
    annotations = (remote.get("metadata") or {}).get("annotations") or {}
    return annotations.get(c.MANAGER_UID_ANNOTATION) == manager["metadata"].get("uid")


def manager_status(remote_status: dict[str, Any], manager: dict[str, Any], worker: str,
                   now: float) -> dict[str, Any]:
    """The status a placed manager TrainJob shows: its copy's whole status, plus the
    dispatcher's ``Placed=True`` naming the worker (kept from the manager when it already
    says so, so that copying the same status again writes nothing). A copy that has
    reported nothing yet gives nothing: Placed=True rides on the first status copy rather
    than costing a write of its own."""
    if not remote_status:
        return {}
    message = f"placed on worker cluster {worker}"
    placed = {"type": c.CONDITION_PLACED, "status": "True", "reason": c.REASON_PLACED,
              "message": message, "lastTransitionTime": format_time(now)}
    current = conditions.find(manager, c.CONDITION_PLACED)
    if current and current.get("status") == "True" and current.get("message") == message:
        placed = current
    own = [x for x in remote_status.get("conditions") or [] if x.get("type") != c.CONDITION_PLACED]
    # First, so that the newest condition (the State column) stays the copy's.
    return {**remote_status, "conditions": [placed, *own]}
