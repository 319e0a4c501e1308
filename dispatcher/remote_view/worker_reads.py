"""Reads of a job's Pods, Events and logs on its worker, through API clients of the remote
view's own: one per worker, made from the worker's connection settings (its apiserver and
the dispatcher's identity there) but with a pool, no rate limit and timeouts of their own.
Placement's and the reconciles' client to a worker never carries a read made for a user,
and a slow worker holds a user's request, never a reconcile."""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlencode

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.kubeclient import RateLimitedApiClient
from controller_kit.writes import object_path, request_json
from dispatcher.remote_view import items, logs
from dispatcher.remote_view.copies import Copy
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c

log = logging.getLogger(__name__)

# A list of a job's Pods or a namespace's Events answers within this long, or the user's
# request fails (504); a log stream may take this long to connect.
READ_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 5.0
USER_AGENT = f"{c.DISPATCHER_USER_AGENT} remote-view"
# At most this many Events of a namespace are read from a worker per request.
EVENTS_LIMIT = 1000


class WorkerAnswer(Exception):
    """The worker refused or failed a read: ``code`` is what the user gets, the message
    names the worker and what it said."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _worker_message(err: ApiException) -> str:
    try:
        return orjson.loads(err.body or b"{}").get("message") or str(err.reason)
    except (orjson.JSONDecodeError, AttributeError):
        return (err.body or b"").decode(errors="replace")[:300] if isinstance(
            err.body, bytes) else str(err.body or err.reason)


def answer_of(err: ApiException, worker: str, what: str) -> WorkerAnswer:
    """What the user is told when ``worker`` answers ``err`` to ``what``."""
    message = _worker_message(err)
    if err.status == 0:
        return WorkerAnswer(504, f"worker {worker} did not answer {what}: {err.reason}")
    if err.status in (401, 403):
        # The dispatcher's own identity on the worker, not the user, was refused.
        return WorkerAnswer(502, f"worker {worker} refused the dispatcher's identity {what} "
                                 f"({err.status}: {message}); the worker's administrator "
                                 "opens a namespace to the remote view with a RoleBinding "
                                 "of trainjob-dispatcher-job-viewer (Kueue mode: "
                                 "trainjob-dispatcher-reader-job-viewer; "
                                 "docs/remote-view.md)")
    return WorkerAnswer(err.status, f"worker {worker}: {message}")


class WorkerReads:
    """The remote view's clients to the workers, made on first use and made again when a
    worker reconnects (a new kubeconfig)."""

    def __init__(self, idle_timeout: float):
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[client.ApiClient, RateLimitedApiClient]] = {}

    def client(self, worker: WorkerCluster) -> RateLimitedApiClient:
        source = worker.api
        if source is None:
            raise WorkerAnswer(503, f"worker {worker.name} is not connected")
        with self._lock:
            kept = self._clients.get(worker.name)
            if kept is not None and kept[0] is source:
                return kept[1]
            made = RateLimitedApiClient(source.configuration, None,
                                        request_timeout=READ_TIMEOUT_SECONDS)
            made.user_agent = USER_AGENT
            self._clients[worker.name] = (source, made)
        if kept is not None:
            kept[1].close()
        return made

    def close(self) -> None:
        with self._lock:
            kept, self._clients = list(self._clients.values()), {}
        for _, made in kept:
            made.close()

    def _list(self, copy: Copy, plural: str, what: str, **query: str) -> list[dict]:
        api = self.client(copy.worker)
        try:
            answer = request_json(api, "GET", object_path("", "v1", copy.namespace, plural),
                                  None, query=sorted(query.items()))
        except ApiException as err:
            raise answer_of(err, copy.worker.name, what) from None
        except Exception as err:  # noqa: BLE001 - a worker that does not answer in time
            raise WorkerAnswer(504, f"worker {copy.worker.name} did not answer {what}: "
                                    f"{str(err).splitlines()[0][:200]}") from None
        return answer.get("items") or []

    def pods(self, copy: Copy, name: str | None = None) -> list[dict]:
        """The Pods of the copy (its JobSet's), or the one named ``name`` among them."""
        query = {"labelSelector": f"{c.JOBSET_NAME_LABEL}={copy.name}"}
        if name is not None:
            query["fieldSelector"] = f"metadata.name={name}"
        return self._list(copy, "pods", f"a list of the Pods of {copy.key}", **query)

    def events(self, copy: Copy) -> list[dict]:
        """The Events about the copy and its children (JobSet, Jobs, Pods)."""
        found = self._list(copy, "events", f"a list of the Events in {copy.namespace}",
                           limit=str(EVENTS_LIMIT))
        return [event for event in found if items.belongs_to(event, copy.name)]

    def open_log(self, copy: Copy, pod: str, options: dict[str, object]):
        """The worker's answer to pods/log of ``pod`` with ``options``, its body not read
        yet (a urllib3 response): a stream that ends when no byte comes for the idle
        timeout. WorkerAnswer when the worker refuses (its status and message)."""
        api = self.client(copy.worker)
        path = object_path("", "v1", copy.namespace, "pods", pod, "log")
        query = logs.as_query(options)
        headers = {"Accept": "*/*", **api.default_headers}
        api.update_params_for_auth(headers, query, ["BearerToken"], path, "GET", None)
        url = api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        what = f"the log of Pod {copy.namespace}/{pod}"
        try:
            response = api.call_api("GET", url, headers, None, None,
                                    _request_timeout=(CONNECT_TIMEOUT_SECONDS,
                                                      self.idle_timeout))
        except ApiException as err:
            raise answer_of(err, copy.worker.name, what) from None
        except Exception as err:  # noqa: BLE001 - not reaching the worker is its 504
            raise WorkerAnswer(504, f"worker {copy.worker.name} did not answer {what}: "
                                    f"{str(err).splitlines()[0][:200]}") from None
        raw = response.response
        if not 200 <= raw.status <= 299:
            body = raw.read()
            raw.release_conn()
            error = ApiException(status=raw.status, reason=raw.reason)
            error.body = body
            raise answer_of(error, copy.worker.name, what)
        return raw
