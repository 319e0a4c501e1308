"""Reads of a job's Pods, Events and logs on its worker, through API clients of the remote
view's own: one per worker, made from the worker's connection settings (its apiserver and
the dispatcher's identity there) but with a pool, a budget and timeouts of their own.
Placement's and the reconciles' client to a worker never carries a read made for a user,
and a slow worker holds a user's request, never a reconcile.

What one request costs a worker is bounded: the copies a list asks about are read per
worker, one Pods LIST (a set-based selector on their JobSets' names) and one paginated
Events LIST of the namespace for all of them, never one per job; each worker's reads share
a budget (``READ_QPS``, ``READ_BURST``: beyond it a read waits at most a second, then the
user gets 429); a namespace's Events are read ``EVENTS_PAGE`` at a time up to
``EVENTS_LIMIT``, and a list cut there says so."""

from __future__ import annotations

import logging
import threading

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.kubeclient import RateLimitedApiClient
from controller_kit.metrics_auth import ReviewBudget, ReviewBudgetSpent
from controller_kit.writes import object_path, request_json
from dispatcher.remote_view import items
from dispatcher.remote_view.copies import Copy
from dispatcher.remote_view.streams import message_of, open_stream
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c

log = logging.getLogger(__name__)

# A list of a job's Pods or a namespace's Events answers within this long, or the user's
# request fails (504); a log stream may take this long to connect.
READ_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 5.0
USER_AGENT = f"{c.DISPATCHER_USER_AGENT} remote-view"
# A namespace's Events are read this many a page, at most EVENTS_LIMIT of them per request.
EVENTS_PAGE = 500
EVENTS_LIMIT = 5000
# A worker's reads for the remote view (or the dashboard), per second, and saved up; a
# read that would wait longer than READ_WAIT_SECONDS for the budget is refused (429).
# Sized so that --remote-api-max-streams (50) users opening their logs at once (two reads
# each: the Pod, then its log) pass on one worker without waiting more than a second.
READ_QPS = 50.0
READ_BURST = 100
READ_WAIT_SECONDS = 1.0
# The JobSet names one Pods LIST selects by name (`in (...)`); more copies on one worker
# are selected by the label's presence and kept here (a URL of bounded length).
NAMED_IN_SELECTOR = 50


class WorkerAnswer(Exception):
    """The worker refused or failed a read: ``code`` is what the user gets, the message
    names the worker and what it said."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def answer_of(err: ApiException, worker: str, what: str) -> WorkerAnswer:
    """What the user is told when ``worker`` answers ``err`` to ``what``."""
    message = message_of(err)
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


def _spent(worker: str, what: str) -> WorkerAnswer:
    return WorkerAnswer(429, f"worker {worker}: {what} not asked: more than {READ_QPS:g} "
                             "reads a second for users' views of its jobs already; retry "
                             "in a moment")


class WorkerReads:
    """The remote view's clients to the workers, made on first use and made again when a
    worker reconnects (a new kubeconfig)."""

    def __init__(self, idle_timeout: float, *, events_page: int = EVENTS_PAGE,
                 events_limit: int = EVENTS_LIMIT):
        self.idle_timeout = idle_timeout
        self.events_page, self.events_limit = events_page, events_limit
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
            made = RateLimitedApiClient(source.configuration,
                                        ReviewBudget(READ_QPS, READ_BURST, READ_WAIT_SECONDS),
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

    def _page(self, worker: WorkerCluster, namespace: str, plural: str, what: str,
              **query: str) -> dict:
        api = self.client(worker)
        try:
            return request_json(api, "GET", object_path("", "v1", namespace, plural),
                                None, query=sorted(query.items()))
        except ApiException as err:
            raise answer_of(err, worker.name, what) from None
        except ReviewBudgetSpent:
            raise _spent(worker.name, what) from None
        except Exception as err:  # noqa: BLE001 - a worker that does not answer in time
            raise WorkerAnswer(504, f"worker {worker.name} did not answer {what}: "
                                    f"{str(err).splitlines()[0][:200]}") from None

    def _list(self, copy: Copy, plural: str, what: str, **query: str) -> list[dict]:
        return self._page(copy.worker, copy.namespace, plural, what,
                          **query).get("items") or []

    def pods(self, copy: Copy, name: str | None = None) -> list[dict]:
        """The Pods of the copy (its JobSet's), or the one named ``name`` among them."""
        query = {"labelSelector": f"{c.JOBSET_NAME_LABEL}={copy.name}"}
        if name is not None:
            query["fieldSelector"] = f"metadata.name={name}"
        return self._list(copy, "pods", f"a list of the Pods of {copy.key}", **query)

    def pods_of(self, copies: list[Copy]) -> dict[str, list[dict]]:
        """The Pods of each copy (by name), copies of one worker and namespace: one LIST."""
        if not copies:
            return {}
        first = copies[0]
        names = sorted({copy.name for copy in copies})
        selector = (f"{c.JOBSET_NAME_LABEL} in ({','.join(names)})"
                    if len(names) <= NAMED_IN_SELECTOR else c.JOBSET_NAME_LABEL)
        found: dict[str, list[dict]] = {name: [] for name in names}
        for pod in self._page(first.worker, first.namespace, "pods",
                              f"a list of the Pods of {len(names)} TrainJobs' copies in "
                              f"{first.namespace}", labelSelector=selector).get("items") or []:
            owner = ((pod.get("metadata") or {}).get("labels") or {}).get(c.JOBSET_NAME_LABEL)
            if owner in found:
                found[owner].append(pod)
        return found

    def events(self, copy: Copy) -> list[dict]:
        """The Events about the copy and its children (JobSet, Jobs, Pods)."""
        found, cut = self.events_of([copy])
        if cut:
            log.info("remote view: %s", cut)
        return found[copy.name]

    def events_of(self, copies: list[Copy], name: str | None = None
                  ) -> tuple[dict[str, list[dict]], str]:
        """The Events about each copy and its children (by copy name), copies of one worker
        and namespace: the namespace's Events read once, a page at a time (only the one
        named ``name``, when given); and, when not every Event could be read, why (else
        "")."""
        if not copies:
            return {}, ""
        worker, namespace = copies[0].worker, copies[0].namespace
        what = f"a list of the Events in {namespace}"
        query = {"limit": str(self.events_page)}
        if name is not None:
            query["fieldSelector"] = f"metadata.name={name}"
        events: list[dict] = []
        cut = ""
        while True:
            try:
                page = self._page(worker, namespace, "events", what, **query)
            except WorkerAnswer as answer:
                if answer.code != 410 or not events:
                    raise
                cut = (f"worker {worker.name}: the Events of namespace {namespace} changed "
                       f"too much while they were read; {len(events)} of them were read, "
                       "the rest left out: ask again")
                break
            events += page.get("items") or []
            more = (page.get("metadata") or {}).get("continue")
            if not more:
                break
            if len(events) >= self.events_limit:
                cut = (f"worker {worker.name}: namespace {namespace} holds more than "
                       f"{self.events_limit} Events; only the first {len(events)} were "
                       "read, so some Events of its jobs may be left out")
                break
            query["continue"] = more
        return _by_copy(events, {copy.name for copy in copies}), cut

    def open_log(self, copy: Copy, pod: str, options: dict[str, object]):
        """The worker's answer to pods/log of ``pod`` with ``options``, its body not read
        yet (a urllib3 response): a stream that ends when no byte comes for the idle
        timeout. WorkerAnswer when the worker refuses (its status and message)."""
        api = self.client(copy.worker)
        path = object_path("", "v1", copy.namespace, "pods", pod, "log")
        what = f"the log of Pod {copy.namespace}/{pod}"
        try:
            return open_stream(api, path, options, (CONNECT_TIMEOUT_SECONDS,
                                                    self.idle_timeout))
        except ApiException as err:
            raise answer_of(err, copy.worker.name, what) from None
        except ReviewBudgetSpent:
            raise _spent(copy.worker.name, what) from None
        except Exception as err:  # noqa: BLE001 - not reaching the worker is its 504
            raise WorkerAnswer(504, f"worker {copy.worker.name} did not answer {what}: "
                                    f"{str(err).splitlines()[0][:200]}") from None


def _by_copy(events: list[dict], names: set[str]) -> dict[str, list[dict]]:
    """Each copy's Events: those about an object named as the copy or beginning with its
    name and a dash (its JobSet, Jobs and Pods), of the kinds a job's copy makes."""
    found: dict[str, list[dict]] = {name: [] for name in names}
    for event in events:
        involved = (event.get("involvedObject") or {}).get("name") or ""
        # The copy names this Event's object may begin with: the whole name, or any part
        # of it before a dash.
        prefixes = {involved} | {involved[:at] for at, char in enumerate(involved)
                                 if char == "-"}
        for name in prefixes & names:
            if items.belongs_to(event, name):
                found[name].append(event)
    return found
