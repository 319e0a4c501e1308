"""The remote view's HTTPS server (``--remote-api-port``), on every replica, leader or
standby: reads need no leadership, and every replica keeps the caches that find a job's
copy.

Only the aggregation layer is served: a connection must present a client certificate of
the front proxy's CA (``requestheader-client-ca-file``) in its TLS handshake, or it is
closed there. Bounded so that no caller can hold the process, with the bounded listener of
the secure metrics endpoint (``controller_kit.observability.bind_server``,
``connection_limits``): at most ``max_streams`` + ``EXTRA_CONNECTIONS`` connections are
served at once by a fixed pool of threads (more wait a moment in a short line, then are
closed); a connection's TLS handshake and its first request's headers are done within
``HEADERS_SECONDS``, the next request on a kept-alive connection comes within
``KEEPALIVE_SECONDS``, or it is cut; a request refused as unauthenticated closes its
connection. An authenticated request is then answered within its own bounds: the worker
reads' timeouts and budget, ``IO_SECONDS`` for each write to a caller that stopped
reading; at most ``max_streams`` logs are relayed at once (beyond: 429 with the reason); a
log is relayed a buffer of ``STREAM_BUFFER`` bytes at a time (a slow reader slows the
worker's stream, nothing piles up here) and ends when the worker sends nothing for the
idle timeout, or as soon as the caller goes away."""

from __future__ import annotations

import http.server
import logging
import select
import ssl
import threading
from collections import defaultdict
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from controller_kit import label_selector
from controller_kit.connection_limits import ConnectionLimits
from controller_kit.observability import Server, bind_server
from controller_kit.serving_certificate import ServingCertificate
from dispatcher.remote_view import (
    APISERVICE,
    EVENTS,
    GROUP,
    GROUP_VERSION,
    LOG,
    PODS,
    SERVICE,
    TRAINJOB_LABEL,
    discovery,
    items,
)
from dispatcher.remote_view.authn import FrontProxySettings, Unauthenticated, User, authenticate
from dispatcher.remote_view.authz import AccessReviews, Attributes
from dispatcher.remote_view.certificate import SecretCertificate, hosts_of
from dispatcher.remote_view.copies import Copy, CopyLocator, CopyProblem, Keeping
from dispatcher.remote_view.logs import BadLogOption, log_options
from dispatcher.remote_view.worker_reads import USER_AGENT, WorkerAnswer, WorkerReads

log = logging.getLogger(__name__)

# The TLS handshake and the first request's headers, and then each next request's headers
# on a kept-alive connection: the aggregator sends them at once, a caller that does not is
# cut. (Its connections idle longer are closed here; it opens new ones.)
HEADERS_SECONDS = 10.0
KEEPALIVE_SECONDS = 10.0
# A request other than a log's is answered within this long (its worker reads have their
# own timeouts and budget), or cut.
ANSWER_SECONDS = 60.0
# Each blocking read or write of a connection, e.g. to a caller that stopped reading.
IO_SECONDS = 30.0
STREAM_BUFFER = 64 * 1024
# Connections beyond the log streams: lists, discovery, the aggregator's checks.
EXTRA_CONNECTIONS = 32
# Connections accepted beyond the pool's threads, and how long one waits for a thread.
WAITING_CONNECTIONS = 64
WAIT_SECONDS = 2.0
KINDS = {PODS: "TrainJobPod", EVENTS: "TrainJobEvent"}


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    namespace: str  # the dispatcher's: where its certificate Secret and Service are
    max_streams: int = 50
    stream_idle_timeout: float = 300.0
    cert_dir: str | None = None
    service: str = SERVICE
    apiservice: str = APISERVICE

    @property
    def secret(self) -> str:
        return f"{self.service}-cert"


class Refusal(Exception):
    def __init__(self, code: int, message: str, name: str = "", kind: str = ""):
        super().__init__(message)
        self.code, self.name, self.kind = code, name, kind


class RemoteView:
    """The server and what it answers with; ``start()`` listens, ``stop()`` ends it."""

    def __init__(self, settings: Settings, manager, locator: CopyLocator):
        self.settings = settings
        self.locator = locator
        self.front_proxy = FrontProxySettings(manager)
        self.reviews = AccessReviews(manager, USER_AGENT)
        self.reads = WorkerReads(settings.stream_idle_timeout)
        self.certificate = None if settings.cert_dir else SecretCertificate(
            manager, settings.namespace, settings.secret,
            hosts_of(settings.service, settings.namespace), settings.apiservice)
        self.serving = ServingCertificate(
            settings.cert_dir or self.certificate.directory, what="remote view",
            flag="--remote-api-cert-dir" if settings.cert_dir
            else f"the pair of {self.certificate.where}, written to")
        self.streams = threading.BoundedSemaphore(settings.max_streams)
        self.limits = ConnectionLimits(threads=settings.max_streams + EXTRA_CONNECTIONS,
                                       waiting=WAITING_CONNECTIONS, wait_seconds=WAIT_SECONDS,
                                       deadline_seconds=HEADERS_SECONDS)
        self.dropped: dict[str, int] = defaultdict(int)  # connections closed unserved, by why
        self._server: Server | None = None
        self.thread: threading.Thread | None = None
        self.port = settings.port

    # --- running --------------------------------------------------------------------

    def start(self) -> RemoteView:
        self.front_proxy.start()
        if self.certificate is not None:
            self.certificate.start()
        handler = type("RemoteViewHandler", (_Handler,), {"view": self})
        self._server = bind_server(self.settings.host, self.settings.port, handler,
                                   tls=self._context, limits=self.limits,
                                   on_drop=self._dropped, name="remote-view-connection")
        self.port = self._server.server_address[1]
        self.thread = threading.Thread(target=self._server.serve_forever, name="remote-view",
                                       daemon=True)  # the dispatcher's manager watches it
        self.thread.start()
        log.info("remote view (%s) serving on %s port %d to the front proxy's client "
                 "certificate only: at most %d log streams and %d connections at once",
                 GROUP_VERSION, self.settings.host, self.port, self.settings.max_streams,
                 self.limits.threads)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.pool.close()
        self.front_proxy.stop()
        if self.certificate is not None:
            self.certificate.stop()
        self.reads.close()
        self.reviews.close()

    def _dropped(self, reason: str) -> None:
        self.dropped[reason] += 1

    def _context(self) -> ssl.SSLContext:
        """The TLS context for a new connection: the current certificate, and a client
        certificate of the front proxy's current CA required. Raises (the connection is
        closed unserved) while there is no certificate or no front-proxy CA."""
        config = self.front_proxy.current()
        if config.problem:
            raise OSError(config.problem)
        if self.certificate is not None and not self.certificate.synced.is_set():
            raise OSError(f"no serving certificate yet ({self.certificate.where})")
        return self.serving.context(config.client_ca)

    # --- answers --------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the view cannot serve now (None: it can), for the dispatcher's readiness."""
        if self._server is None:
            return "the remote view is not listening yet"
        problem = self.front_proxy.current().problem
        if problem:
            return f"remote view: {problem}"
        if self.certificate is not None and not self.certificate.synced.is_set():
            return f"remote view: no serving certificate yet ({self.certificate.where})"
        try:
            self.serving.context()
        except OSError as err:
            return f"remote view: {err}"
        return None

    def authorize(self, user: User, attributes: Attributes) -> None:
        decision = self.reviews.review(user, attributes)
        if decision.allowed:
            return
        resource = attributes.resource + (f"/{attributes.subresource}"
                                          if attributes.subresource else "")
        if decision.status != 403:
            raise Refusal(int(decision.status), f"{resource}.{GROUP} {attributes.name}: "
                                                f"{decision.reason}; retry later",
                          attributes.name, attributes.resource)
        name = f' "{attributes.name}"' if attributes.name else ""
        raise Refusal(403, f"{attributes.resource}.{GROUP}{name} is forbidden: User "
                           f'"{user.name}" cannot {attributes.describe()}: '
                           f"{decision.reason or 'no RBAC rule allows it'} (the view, edit "
                           "and admin ClusterRoles grant it once manifests/remote-api is "
                           "applied)", attributes.name, attributes.resource)

    def _job_names(self, namespace: str, selector) -> tuple[list[str], bool]:
        """The TrainJobs a list asks about, and whether the selector named them."""
        named: set[str] | None = None
        for requirement in selector.requirements if selector else ():
            if requirement.key == TRAINJOB_LABEL and requirement.operator in ("=", "in"):
                values = set(requirement.values)
                named = values if named is None else named & values
        if named is not None:
            return sorted(named), True
        return self.locator.jobs(namespace), False

    def list_items(self, resource: str, namespace: str, query: dict
                   ) -> tuple[list[dict], list[str]]:
        """The items a list asks for, and what to warn the caller of (Events left out).
        The copies are read per worker: one Pods or Events LIST each, whatever their
        number."""
        text = (query.get("labelSelector") or [""])[-1]
        try:
            selector = label_selector.parse(text) if text.strip() else None
        except label_selector.InvalidSelector as err:
            raise Refusal(400, f"labelSelector {text!r}: {err}") from None
        names, named = self._job_names(namespace, selector)
        by_worker: dict[str, list[Copy]] = defaultdict(list)
        for name in names:
            try:
                copy = self.locator.find(namespace, name)
            except CopyProblem as problem:
                if named and len(names) == 1:
                    raise Refusal(problem.code, str(problem), name, "TrainJob") from None
                continue
            by_worker[copy.worker.name].append(copy)
        found: list[dict] = []
        warnings: list[str] = []
        for worker in sorted(by_worker):
            read, cut = self._read_all(resource, by_worker[worker])
            found += read
            if cut:
                warnings.append(cut)
        return ([item for item in found
                 if selector is None or selector.matches(item["metadata"]["labels"])],
                warnings)

    def _read_all(self, resource: str, copies: list[Copy]) -> tuple[list[dict], str]:
        """The items of ``copies`` (one worker's, one namespace's), and what was cut."""
        worker = copies[0].worker.name
        try:
            if resource == PODS:
                pods = self.reads.pods_of(copies)
                return [items.pod_item(pod, copy.name, worker)
                        for copy in copies for pod in pods[copy.name]], ""
            events, cut = self.reads.events_of(copies)
            return [items.event_item(event, copy.name, worker)
                    for copy in copies for event in events[copy.name]], cut
        except WorkerAnswer as answer:
            name = copies[0].name if len(copies) == 1 else ""
            raise Refusal(answer.code, str(answer), name, KINDS[resource]) from None

    def _read(self, resource: str, copy: Copy, name: str) -> list[dict]:
        """The Pod or Event named ``name`` of ``copy``, if it is one of its."""
        worker = copy.worker.name
        try:
            if resource == PODS:
                return [items.pod_item(pod, copy.name, worker)
                        for pod in self.reads.pods(copy, name)]
            events, _ = self.reads.events_of([copy], name)
            return [items.event_item(event, copy.name, worker) for event in events[copy.name]]
        except WorkerAnswer as answer:
            raise Refusal(answer.code, str(answer), name, KINDS[resource]) from None

    def find(self, resource: str, namespace: str, name: str) -> tuple[Copy, dict]:
        """The copy a Pod (or Event) named ``name`` belongs to, and its item: the jobs whose
        names its own begins with, longest first."""
        candidates = sorted((job for job in self.locator.jobs(namespace)
                             if name.startswith((f"{job}-", f"{job}."))),
                            key=len, reverse=True)
        problems = []
        for job in candidates:
            try:
                copy = self.locator.find(namespace, job)
            except CopyProblem as problem:
                problems.append(str(problem))
                continue
            found = self._read(resource, copy, name)
            if found:
                return copy, found[0]
        why = "; ".join(problems) or (f"no TrainJob of namespace {namespace} has a copy "
                                      "whose Pods or Events it names")
        raise Refusal(404, f'{resource}.{GROUP} "{name}" not found in namespace {namespace}: '
                           f"{why}", name, KINDS[resource])


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainjob-dispatcher-remote-view"
    timeout = IO_SECONDS
    view: RemoteView  # set on the subclass each RemoteView serves with
    _requests = 0

    def handle_one_request(self) -> None:
        # The first request's headers are within the pool's deadline, which began with the
        # handshake; each next one on a kept-alive connection gets a deadline of its own.
        if self._requests and not self.server.pool.set_deadline(KEEPALIVE_SECONDS):
            self.close_connection = True
            return
        self._requests += 1
        super().handle_one_request()

    def _answering(self, seconds: float | None) -> None:
        """The request is authenticated: it is answered within ``seconds`` (None: its own
        bounds only, a log stream's), no longer the headers' deadline."""
        if not self.server.pool.set_deadline(seconds):
            raise ConnectionResetError("cut at its deadline")

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("remote view: %s %s", self.address_string(), format % args)

    # --- writing --------------------------------------------------------------------

    def _send(self, code: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: dict, headers: dict[str, str] | None = None) -> None:
        self._send(code, orjson.dumps(obj), headers=headers)

    def send_warnings(self, warnings: list[str]) -> None:
        """Warnings kubectl prints (``Warning: ...``), as the apiserver sends them."""
        for text in warnings:
            self.send_header("Warning", '299 - "' + text.replace('"', "'") + '"')

    def _refuse(self, refusal: Refusal) -> None:
        headers = {"Retry-After": "1"} if refusal.code == 429 else {}
        if self.close_connection:
            headers["Connection"] = "close"
        if refusal.code >= 500:
            log.warning("remote view: %s %s: %s", self.command, self.path, refusal)
        self._json(refusal.code, items.status(refusal.code, str(refusal), name=refusal.name,
                                              kind=refusal.kind), headers)

    # --- reading --------------------------------------------------------------------

    def _refuse_method(self) -> None:
        self._refuse(Refusal(405, f"{self.command} {urlsplit(self.path).path}: this API is "
                                  "read-only (get and list; log with get)"))

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse_method

    def do_GET(self) -> None:
        try:
            self._get()
        except Refusal as refusal:
            self._refuse(refusal)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, TimeoutError):
            self.close_connection = True
        except Exception as err:  # said to the caller, not raised
            log.exception("remote view: GET %s failed", self.path)
            self._refuse(Refusal(500, f"GET {urlsplit(self.path).path}: {err}"))

    def _get(self) -> None:
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query, keep_blank_values=True)
        if path in ("/healthz", "/livez", "/readyz"):
            # Only the front proxy's certificate gets this far; the kubelet probes the
            # dispatcher's health port, never this one.
            problem = self.view.problem() if path == "/readyz" else None
            self._send(500 if problem else 200, (problem or "ok").encode(),
                       "text/plain; charset=utf-8")
            return
        try:
            user = authenticate(self.view.front_proxy.current(),
                                self.connection.getpeercert(), self.headers)
        except Unauthenticated as err:
            self.close_connection = True  # nothing more is waited for on this connection
            raise Refusal(401, f"Unauthorized: {err}") from None
        self._answering(ANSWER_SECONDS)
        document = discovery.document(path)
        if document is not None:
            self._json(200, document)
            return
        prefix = f"/apis/{GROUP_VERSION}/namespaces/"
        if not path.startswith(prefix):
            if path.startswith(f"/apis/{GROUP_VERSION}/"):
                raise Refusal(404, f"{path}: only namespaced requests are served (kubectl "
                                   "-n NAMESPACE; across namespaces is not)")
            raise Refusal(404, f"{path}: not served here (only /apis/{GROUP_VERSION})")
        segments = [unquote(s) for s in path[len(prefix):].split("/")]
        if len(segments) < 2 or segments[1] not in (PODS, EVENTS) or len(segments) > 4 \
                or (len(segments) == 4 and (segments[1], segments[3]) != (PODS, LOG)):
            raise Refusal(404, f"{path}: no such resource (served: {PODS}, {PODS}/{LOG}, "
                               f"{EVENTS})")
        namespace, resource = segments[0], segments[1]
        name = segments[2] if len(segments) > 2 else ""
        subresource = segments[3] if len(segments) > 3 else ""
        if (query.get("watch") or [""])[-1] in ("true", "1"):
            raise Refusal(405, f"{resource}: watch is not served (get and list only)",
                          kind=KINDS[resource])
        attributes = Attributes("get" if name else "list", resource, namespace, name,
                                subresource)
        self.view.authorize(user, attributes)
        if subresource:
            self._log(namespace, name, query, user)
            return
        if name:
            _, item = self.view.find(resource, namespace, name)
            self._answer(resource, [item], single=True)
            return
        found, warnings = self.view.list_items(resource, namespace, query)
        self._answer(resource, found, warnings=warnings)

    def _answer(self, resource: str, found: list[dict], single: bool = False,
                warnings: list[str] = ()) -> None:
        kind = KINDS[resource]
        if items.wants_table(self.headers.get("Accept")):
            body = items.table(kind, found)
        elif single:
            body = found[0]
        else:
            body = items.list_of(kind, found)
        data = orjson.dumps(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_warnings(list(warnings))
        self.end_headers()
        self.wfile.write(data)

    # --- logs -----------------------------------------------------------------------

    def _log(self, namespace: str, pod: str, query: dict, user: User) -> None:
        try:
            options = log_options(query)
        except BadLogOption as err:
            raise Refusal(400, f"{PODS}/{LOG} {namespace}/{pod}: {err}", pod, "TrainJobPod") \
                from None
        self._answering(None)  # bounded by the worker's idle timeout and IO_SECONDS
        if not self.view.streams.acquire(blocking=False):
            raise Refusal(429, f"{PODS}/{LOG} {namespace}/{pod}: "
                               f"{self.view.settings.max_streams} logs are being relayed "
                               "already, the most this dispatcher relays at once "
                               "(--remote-api-max-streams); retry later", pod, "TrainJobPod")
        try:
            copy, _ = self.view.find(PODS, namespace, pod)
            try:
                upstream = self.view.reads.open_log(copy, pod, options)
            except WorkerAnswer as answer:
                raise Refusal(answer.code, str(answer), pod, "TrainJobPod") from None
            log.info("remote view: %s reads the log of %s/%s on %s (%s)", user.name,
                     namespace, pod, copy.worker.name,
                     ", ".join(f"{k}={v}" for k, v in options.items()) or "no options")
            self._relay(upstream)
        finally:
            self.view.streams.release()

    def _relay(self, upstream) -> None:
        """The worker's answer, chunk by chunk, until it ends, the worker is idle for the
        idle timeout, or the caller goes away (then the worker's stream is cut too)."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type",
                         upstream.headers.get("Content-Type", "text/plain"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_caller, args=(upstream, done),
                                   daemon=True, name="remote-view-log-watch")
        watcher.start()
        try:
            while True:
                try:
                    data = upstream.read1(STREAM_BUFFER)
                except Exception as err:  # noqa: BLE001 - idle timeout, cut, worker gone
                    log.debug("remote view: log stream ended: %s", err)
                    break
                if not data:
                    break
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            done.set()
            try:
                upstream.release_conn()
            except Exception:  # noqa: BLE001 - best effort: the stream is over either way
                pass

    def _watch_caller(self, upstream, done: threading.Event) -> None:
        """Nothing more comes from a caller while its log streams; its connection turning
        readable means it closed: the worker's stream is then shut down."""
        while not done.is_set():
            try:
                readable, _, _ = select.select([self.connection], [], [], 0.5)
            except (OSError, ValueError):
                readable = [True]
            if readable and not done.is_set():
                try:
                    upstream.shutdown()
                except Exception:  # noqa: BLE001 - best effort: the caller has gone
                    pass
                return


def start_remote_view(manager, config, trainjobs, registry) -> RemoteView | None:
    """The remote view of the dispatcher's configuration, started; None when it is off
    (no ``remote_api_port``)."""
    if config.remote_api_port is None:
        return None
    settings = Settings(host=config.remote_api_host, port=config.remote_api_port,
                        namespace=config.namespace,
                        max_streams=config.remote_api_max_streams,
                        stream_idle_timeout=config.remote_api_stream_idle_timeout_seconds,
                        cert_dir=str(config.remote_api_cert_dir)
                        if config.remote_api_cert_dir else None,
                        service=config.remote_api_service)
    locator = CopyLocator(trainjobs.get, trainjobs.list,
                          lambda: registry.snapshot(draining=True), Keeping.of(config))
    return RemoteView(settings, manager, locator).start()
