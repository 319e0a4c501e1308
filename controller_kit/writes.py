"""The writes a controller makes per object, as plain JSON requests.

The generated client's methods validate their arguments, walk the body to serialise it
and, for built-in kinds, turn the answer into model objects (an Event's answer alone
costs more than its request): a third of a write's CPU, spent on objects this project
reads as dictionaries anyway. These send the body as it is and return the answer as a
dictionary, through the same ``ApiClient`` (credentials, rate limit, metrics, the
kept-alive connections of ``lean_http``), and raise the client's ``ApiException`` for
any answer that is not a success. ``request_json`` also serves the few frequent reads that
need no cache (a worker probe's GET of ``/version``).
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


def request_json(api: client.ApiClient, method: str, path: str, body: dict | bytes | None,
                 *, query: list[tuple[str, str]] | None = None,
                 content_type: str = JSON, timeout: float | None = None) -> dict:
    """``method`` ``path`` with ``body`` (a dict sent as JSON, bytes as they are, or none);
    the answer's object. ``timeout``: the request's own (else the client's)."""
    headers = {"Content-Type": content_type, "Accept": JSON, **api.default_headers}
    if api.cookie:
        headers["Cookie"] = api.cookie
    queries = list(query or [])
    # Credentials as every generated call gets them (a bearer token refreshed when its
    # configuration says so; client certificates are the connection's).
    api.update_params_for_auth(headers, queries, ["BearerToken"], path, method, body)
    url = api.configuration.host + path + (f"?{urlencode(queries)}" if queries else "")
    # None leaves the client's own timeout (``RateLimitedApiClient`` fills it in).
    response = api.call_api(method, url, headers, body, None, _request_timeout=timeout)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(http_resp=response)
    return orjson.loads(data)


def object_path(group: str, version: str, namespace: str | None, plural: str,
                name: str | None = None, subresource: str | None = None) -> str:
    """The API path of a collection or an object (core group when ``group`` is empty)."""
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{plural}"
    if name:
        path += f"/{quote(name, safe='')}"
    if subresource:
        path += f"/{subresource}"
    return path


def create(api: client.ApiClient, group: str, version: str, namespace: str, plural: str,
           body: dict, field_manager: str | None = None) -> dict:
    """POST ``body`` into the collection; the object as created."""
    return request_json(api, "POST", object_path(group, version, namespace, plural), body,
                        query=_manager(field_manager))


def merge_patch(api: client.ApiClient, group: str, version: str, namespace: str, plural: str,
                name: str, patch: dict, field_manager: str | None = None) -> dict:
    """A JSON merge patch of the object; the object as patched."""
    return request_json(api, "PATCH", object_path(group, version, namespace, plural, name),
                        patch, query=_manager(field_manager), content_type=MERGE_PATCH)


def replace_status(api: client.ApiClient, group: str, version: str, namespace: str,
                   plural: str, body: dict, field_manager: str | None = None) -> dict:
    """PUT ``body`` to the object's status subresource (its resourceVersion guards it)."""
    return request_json(api, "PUT", object_path(group, version, namespace, plural,
                                                body["metadata"]["name"], "status"),
                        body, query=_manager(field_manager))


def _manager(field_manager: str | None) -> list[tuple[str, str]]:
    return [("fieldManager", field_manager)] if field_manager else []
