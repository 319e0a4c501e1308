"""A log read over HTTP from an apiserver, as both ends of the remote view make it: the
dispatcher reading a worker's ``pods/log``, and ``kubectl trainjob logs`` reading the
remote view's ``trainjobpods/log`` through the manager. The body is left unread for the
caller to relay; a refusal is the client's ApiException with the apiserver's body."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher.remote_view.logs import as_query


def message_of(err: ApiException) -> str:
    """What the apiserver (or the kubelet behind it) said: a Status's message, else the
    start of the body's text, else the HTTP reason."""
    body = err.body
    try:
        return orjson.loads(body or b"{}").get("message") or str(err.reason)
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
        return text.strip()[:300] or str(err.reason)


def open_stream(api: client.ApiClient, path: str, options: Mapping[str, object],
                timeout: tuple[float, float | None]):
    """GET ``path`` with the log ``options`` as its query, authenticated as ``api`` is
    (through its ``call_api``: its rate limit, if any, applies): the urllib3 response, its
    body not read yet. ``timeout``: (connect, each read; None: no read timeout). Raises
    ApiException for an answer other than 2xx (its body read), or what the client raised."""
    query = as_query(options)
    headers = {"Accept": "*/*", **api.default_headers}
    api.update_params_for_auth(headers, query, ["BearerToken"], path, "GET", None)
    url = api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
    raw = api.call_api("GET", url, headers, None, None, _request_timeout=timeout).response
    if not 200 <= raw.status <= 299:
        error = ApiException(status=raw.status, reason=raw.reason)
        try:
            error.body = raw.read()
        finally:
            raw.release_conn()
        raise error
    return raw
