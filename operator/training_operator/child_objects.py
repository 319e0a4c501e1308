"""Writing the objects plug-ins build beside the JobSet (``ExtraObject``), of any kind, owned
by the TrainJob: applied like the JobSet, or, for a create-only object, created once with its
content made at that moment and never rewritten. The operator knows no plug-in's objects
by name."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.kubeclient import APPLY_PATCH, apply_body
from trainjob.runtime.extension_points import ExtraObject


def _collection(body: dict[str, Any], plural: str) -> str:
    """The REST path of the object's collection in its namespace."""
    group_version = body["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{prefix}/namespaces/{body['metadata']['namespace']}/{plural}"


def _request(api: client.ApiClient, method: str, path: str, body: dict[str, Any] | bytes,
             content_type: str, query: list[tuple[str, str]] | None = None) -> None:
    params = api.param_serialize(
        method=method, resource_path=path, query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body, auth_settings=["BearerToken"])
    response = api.call_api(*params)
    response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)


def write(api: client.ApiClient, obj: ExtraObject, owner: dict[str, Any],
          field_manager: str) -> None:
    """Create or apply ``obj`` with ``owner`` as its controller."""
    body = {**obj.body, "metadata": {**obj.body["metadata"], "ownerReferences": [owner]}}
    collection = _collection(body, obj.plural)
    if obj.create_only:
        try:
            _request(api, "POST", collection, {**body, **obj.make_content()},
                     "application/json")
        except ApiException as err:
            if err.status != 409:  # exists: created once, never rewritten
                raise
        return
    _request(api, "PATCH", f"{collection}/{body['metadata']['name']}", apply_body(body),
             APPLY_PATCH, [("fieldManager", field_manager), ("force", "true")])
