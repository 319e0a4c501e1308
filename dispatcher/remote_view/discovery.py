"""The discovery documents of the remote view, as kubectl and the aggregator read them:
``/apis`` (APIGroupList), ``/apis/<group>`` (APIGroup) and ``/apis/<group>/<version>``
(APIResourceList, with the ``trainjobpods/log`` subresource). Pure."""

from __future__ import annotations

from dispatcher.remote_view import EVENTS, GROUP, GROUP_VERSION, LOG, PODS, VERSION

# Read-only: a list, or one by name. No watch is served.
VERBS = ["get", "list"]


def api_group() -> dict:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version],
            "preferredVersion": version}


def api_group_list() -> dict:
    group = api_group()
    group.pop("kind")
    group.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def api_resource_list() -> dict:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": [
                {"name": PODS, "singularName": "trainjobpod", "namespaced": True,
                 "kind": "TrainJobPod", "verbs": VERBS, "shortNames": ["tjpod"],
                 "categories": ["trainjob"]},
                {"name": f"{PODS}/{LOG}", "singularName": "", "namespaced": True,
                 "kind": "TrainJobPodLog", "verbs": ["get"]},
                {"name": EVENTS, "singularName": "trainjobevent", "namespaced": True,
                 "kind": "TrainJobEvent", "verbs": VERBS, "shortNames": ["tjev"],
                 "categories": ["trainjob"]},
            ]}


def document(path: str) -> dict | None:
    """The discovery document at ``path``, or None when ``path`` is not one."""
    path = path.rstrip("/")
    if path == "/apis":
        return api_group_list()
    if path == f"/apis/{GROUP}":
        return api_group()
    if path == f"/apis/{GROUP_VERSION}":
        return api_resource_list()
    return None
