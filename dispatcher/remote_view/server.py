"""The remote view's HTTPS server (``--remote-api-port``), on every replica, leader or
standby: reads need no leadership, and every replica keeps the caches that find a job's
copy.

Bounded so that no caller can hold the process: at most ``max_connections`` connections
are served at once (more are closed at once), each by a thread of its own that waits at
most ``KEEPALIVE_SECONDS`` for a request; at most ``max_streams`` logs are relayed at once
(beyond: 429 with the reason); a log is relayed a buffer of ``STREAM_BUFFER`` bytes at a
time (a slow reader slows the worker's stream, nothing piles up here) and ends when the
worker sends nothing for the idle timeout, or as soon as the caller goes away."""

from __future__ import annotations

import http.server
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from dispatcher.placement import cluster_selector
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
from dispatcher.remote_view.certificate import (
    DirectoryCertificate,
    SecretCertificate,
    hosts_of,
    load_pair,
)
from dispatcher.remote_view.copies import Copy, CopyLocator, CopyProblem
from dispatcher.remote_view.logs import BadLogOption, log_options
from dispatcher.remote_view.worker_reads import USER_AGENT, WorkerAnswer, WorkerReads

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 60.0
HANDSHAKE_SECONDS = 10.0
STREAM_BUFFER = 64 * 1024
# Connections beyond the log streams: lists, discovery, the aggregator's checks.
EXTRA_CONNECTIONS = 32
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

    def __init__(self, settings: Settings, manager, locator: CopyLocator,
                 ready: Callable[[], tuple[bool, str]]):
        self.settings = settings
        self.locator = locator
        self._ready = ready
        self.front_proxy = FrontProxySettings(manager)
        self.reviews = AccessReviews(manager, USER_AGENT)
        self.reads = WorkerReads(settings.stream_idle_timeout)
        self.certificate = (DirectoryCertificate(settings.cert_dir) if settings.cert_dir
                            else SecretCertificate(manager, settings.namespace, settings.secret,
                                                   hosts_of(settings.service,
                                                            settings.namespace),
                                                   settings.apiservice))
        self.streams = threading.BoundedSemaphore(settings.max_streams)
        self._connections = threading.BoundedSemaphore(settings.max_streams
                                                       + EXTRA_CONNECTIONS)
        self._contexts: dict[tuple, ssl.SSLContext] = {}
        self._socket: socket.socket | None = None
        self._stopping = threading.Event()
        self.port = settings.port

    # --- running --------------------------------------------------------------------

    def start(self) -> RemoteView:
        self.front_proxy.start()
        self.certificate.start()
        host = self.settings.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, self.settings.port), family=family,
                                            backlog=64, reuse_port=False,
                                            dualstack_ipv6=host == "::")
        self.port = self._socket.getsockname()[1]
        threading.Thread(target=self._accept, name="remote-view-accept", daemon=True).start()
        log.info("remote view (%s) serving on %s port %d: at most %d log streams at once",
                 GROUP_VERSION, host, self.port, self.settings.max_streams)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._socket is not None:
            try:
                self._socket.close()
            except OSError:
                pass
        self.front_proxy.stop()
        self.certificate.stop()
        self.reads.close()
        self.reviews.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, address = self._socket.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.1)
                continue
            if not self._connections.acquire(blocking=False):
                log.debug("remote view: %s connections served already; closing one from %s",
                          self.settings.max_streams + EXTRA_CONNECTIONS, address)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, address), daemon=True,
                             name="remote-view-connection").start()

    def _context(self) -> ssl.SSLContext | None:
        """The TLS context for a new connection: the current certificate, and client
        certificates verified against the front proxy's current CA."""
        pair = self.certificate.pair()
        if pair is None:
            return None
        config = self.front_proxy.current()
        key = (pair.stamp, config.client_ca)
        context = self._contexts.get(key)
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            load_pair(context, pair)
            if config.client_ca:
                context.load_verify_locations(cadata=config.client_ca)
                context.verify_mode = ssl.CERT_OPTIONAL
            self._contexts = {key: context}
        return context

    def _serve(self, sock: socket.socket, address) -> None:
        try:
            context = self._context()
            if context is None:
                return
            sock.settimeout(HANDSHAKE_SECONDS)
            try:
                tls = context.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError) as err:
                log.debug("remote view: TLS handshake with %s failed: %s", address, err)
                return
            tls.settimeout(KEEPALIVE_SECONDS)
            _Handler(tls, address, self)
        except Exception:  # one connection must not end the server
            log.debug("remote view: connection from %s failed", address, exc_info=True)
        finally:
            try:
                sock.close()
            except OSError:
                pass
            self._connections.release()

    # --- answers --------------------------------------------------------------------

    def health(self, path: str) -> tuple[int, str]:
        if path in ("/healthz", "/livez"):
            return 200, "ok"
        ready, why = self._ready()
        problem = self.front_proxy.current().problem
        if not ready:
            return 500, why
        if problem:
            return 500, problem
        if self.certificate.pair() is None:
            return 500, "no serving certificate yet"
        return 200, "ok"

    def authorize(self, user: User, attributes: Attributes) -> None:
        verdict = self.reviews.review(user, attributes)
        resource = attributes.resource + (f"/{attributes.subresource}"
                                          if attributes.subresource else "")
        if verdict.failed:
            raise Refusal(500, f"{resource}.{GROUP} {attributes.name}: {verdict.reason}; "
                               "retry later", attributes.name, attributes.resource)
        if not verdict.allowed:
            name = f' "{attributes.name}"' if attributes.name else ""
            raise Refusal(403, f"{attributes.resource}.{GROUP}{name} is forbidden: User "
                               f'"{user.name}" cannot {attributes.describe()}: '
                               f"{verdict.reason or 'no RBAC rule allows it'} (the view, "
                               "edit and admin ClusterRoles grant it once manifests/remote-api "
                               "is applied)", attributes.name, attributes.resource)

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

    def list_items(self, resource: str, namespace: str, query: dict) -> list[dict]:
        text = (query.get("labelSelector") or [""])[-1]
        try:
            selector = cluster_selector.parse(text) if text.strip() else None
        except cluster_selector.InvalidSelector as err:
            raise Refusal(400, f"labelSelector {text!r}: {err}") from None
        names, named = self._job_names(namespace, selector)
        found = []
        for name in names:
            try:
                copy = self.locator.find(namespace, name)
            except CopyProblem as problem:
                if named and len(names) == 1:
                    raise Refusal(problem.code, str(problem), name, "TrainJob") from None
                continue
            found += self._read(resource, copy)
        return [item for item in found
                if selector is None or selector.matches(item["metadata"]["labels"])]

    def _read(self, resource: str, copy: Copy, name: str | None = None) -> list[dict]:
        worker = copy.worker.name
        try:
            if resource == PODS:
                return [items.pod_item(pod, copy.name, worker)
                        for pod in self.reads.pods(copy, name)]
            return [items.event_item(event, copy.name, worker)
                    for event in self.reads.events(copy)
                    if name is None or event["metadata"]["name"] == name]
        except WorkerAnswer as answer:
            raise Refusal(answer.code, str(answer), name or copy.name, KINDS[resource]) from None

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
    view: RemoteView

    def __init__(self, request, client_address, view: RemoteView):
        self.view = view
        super().__init__(request, client_address, view)

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

    def _refuse(self, refusal: Refusal) -> None:
        headers = {"Retry-After": "1"} if refusal.code == 429 else None
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
            code, text = self.view.health(path)
            self._send(code, text.encode(), "text/plain; charset=utf-8")
            return
        try:
            user = authenticate(self.view.front_proxy.current(),
                                self.connection.getpeercert(), self.headers)
        except Unauthenticated as err:
            raise Refusal(401, f"Unauthorized: {err}") from None
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
        self._answer(resource, self.view.list_items(resource, namespace, query))

    def _answer(self, resource: str, found: list[dict], single: bool = False) -> None:
        kind = KINDS[resource]
        if items.wants_table(self.headers.get("Accept")):
            self._json(200, items.table(kind, found))
        elif single:
            self._json(200, found[0])
        else:
            self._json(200, items.list_of(kind, found))

    # --- logs -----------------------------------------------------------------------

    def _log(self, namespace: str, pod: str, query: dict, user: User) -> None:
        try:
            options = log_options(query)
        except BadLogOption as err:
            raise Refusal(400, f"{PODS}/{LOG} {namespace}/{pod}: {err}", pod, "TrainJobPod") \
                from None
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


def start_remote_view(manager, config, trainjobs, registry,
                      ready: Callable[[], tuple[bool, str]]) -> RemoteView | None:
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
                          lambda: registry.snapshot(draining=True))
    return RemoteView(settings, manager, locator, ready).start()
