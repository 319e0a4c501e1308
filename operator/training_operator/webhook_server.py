"""The HTTPS endpoint the apiserver calls for TrainJob and runtime admission (the rules live
in ``webhook.py`` and ``runtime_webhook.py``).

Standard library only: ``http.server.ThreadingHTTPServer`` with TLS. The TLS handshake runs
in the connection's own thread, so a slow or broken client never stalls the accept loop.
A host of ``::`` listens on every interface, IPv6 and IPv4 alike (one dual-stack socket),
or on IPv4 alone (``0.0.0.0``) where the kernel has no IPv6: the apiserver reaches the
webhook's Service by whichever family the cluster gives it.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from controller_kit.observability import NO_IPV6, address
from training_operator.webhook import Lookups, response, review_json

log = logging.getLogger(__name__)

VALIDATE_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
# Upstream's paths for its runtime webhooks; one review function answers all three.
RUNTIME_PATHS = ("/validate-trainer-kubeflow-org-v1alpha1-trainingruntime",
                 "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime")
HEALTH_PATHS = ("/healthz", "/readyz")
MAX_BODY_BYTES = 3 * 1024 * 1024  # the apiserver's own request limit is 3 MiB
DRAIN_FACTOR = 4
# An idle keep-alive connection is dropped after this long; also bounds a stuck handshake.
CONNECTION_TIMEOUT = 30.0

ReviewHook = Callable[[float, bool, str], None]


class WebhookServer:
    """Serves ``POST /validate-trainer-kubeflow-org-v1alpha1-trainjob`` and ``GET /healthz``
    over HTTPS with ``cert_dir/tls.crt`` and ``cert_dir/tls.key``."""

    def __init__(self, port: int, cert_dir: str | Path, lookups: Lookups,
                 host: str = "127.0.0.1", on_review: ReviewHook | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES, drain_seconds: float = 0.0):
        self.host = host
        self.drain_seconds = drain_seconds
        self.draining = False  # set by stop(): answers close their connections from then on
        self.port = port
        self.cert_dir = Path(cert_dir)
        self.lookups = lookups
        self.on_review = on_review
        self.max_body_bytes = max_body_bytes
        self._server: _TLSServer | None = None
        self._thread: threading.Thread | None = None
        self._tls: tuple[tuple[int, int], ssl.SSLContext] | None = None
        self._tls_lock = threading.Lock()
        self._bad_stamp: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        return f"https://{address(self.host, self.port)}{VALIDATE_PATH}"

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that accepts connections while it serves (the operator's manager
        watches it)."""
        return self._thread

    def start(self) -> None:
        """Listen and serve in a background thread; returns once the socket is listening."""
        if self._server is not None:
            return
        self.tls_context()  # a missing or broken certificate fails here, not per request
        try:
            server = _TLSServer((self.host, self.port), self.handler_class(), self)
        except OSError as err:
            if self.host != "::" or err.errno not in NO_IPV6:
                raise
            log.info("no IPv6 here (%s): the %s listens on 0.0.0.0 (IPv4) only",
                     err.strerror, self.description)
            self.host = "0.0.0.0"
            server = _TLSServer((self.host, self.port), self.handler_class(), self)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=self.thread_name,
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        log.info("%s listening on %s", self.description, self.url)

    # What a server on this plumbing (TLS, reload, connection handling) serves; the status
    # server overrides these.
    thread_name = "trainjob-webhook"
    description = "TrainJob webhook"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        return _Handler

    def tls_context(self) -> ssl.SSLContext:
        """The serving context, reloaded when ``tls.crt`` or ``tls.key`` changes (cert-manager
        rotates them in place); a half-written pair keeps the previous context."""
        crt, key = self.cert_dir / "tls.crt", self.cert_dir / "tls.key"
        with self._tls_lock:
            try:
                stamp = (crt.stat().st_mtime_ns, key.stat().st_mtime_ns)
            except OSError:
                if self._tls is None:
                    raise
                return self._tls[1]
            if self._tls is not None and stamp in (self._tls[0], self._bad_stamp):
                return self._tls[1]
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(crt, key)
            except (ssl.SSLError, OSError):
                if self._tls is None:
                    raise
                self._bad_stamp = stamp  # say it once per broken pair, not per connection
                log.warning("cannot load the webhook certificate from %s; keeping the old one",
                            self.cert_dir, exc_info=True)
                return self._tls[1]
            self._tls = (stamp, context)
            return context

    def stop(self) -> None:
        """Drain, then stop accepting, close open connections and release the port.

        The apiserver keeps its connections to a webhook open and reuses them, and it does
        not retry a review whose connection the server closed under it. So for up to
        ``drain_seconds`` the server goes on answering, with ``Connection: close`` on every
        answer: each connection in use ends after its answer, cleanly, and the apiserver
        opens its next one to a Pod that is not stopping. Only connections idle for the
        whole drain are then cut."""
        server, thread = self._server, self._thread
        if server is None:
            return
        server.draining = self.draining = True
        if self.drain_seconds > 0:
            server.drain(self.drain_seconds)
        self._server = self._thread = None
        server.shutdown()
        server.close_connections()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> WebhookServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, webhook: WebhookServer):
        self.webhook = webhook
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)
        self.draining = False
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            # One socket for both families, whatever the kernel's bindv6only default.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would resolve the host's FQDN: a DNS round trip we never use.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def finish_request(self, request, client_address) -> None:
        # Runs in the connection's thread: the handshake happens here, not in accept().
        request.settimeout(CONNECTION_TIMEOUT)
        try:
            tls = self.webhook.tls_context().wrap_socket(request, server_side=True,
                                                         do_handshake_on_connect=False)
        except (ssl.SSLError, OSError) as err:
            log.debug("TLS setup for %s failed: %s", client_address, err)
            return
        with self._lock:
            self._connections.add(tls)  # from here on stop() can cut it short
        try:
            tls.do_handshake()
            self.RequestHandlerClass(tls, client_address, self)
        except (ssl.SSLError, OSError) as err:
            log.debug("webhook connection from %s ended: %s", client_address, err)
        finally:
            with self._lock:
                self._connections.discard(tls)
                self._closed.notify_all()
            _shutdown(tls)
            tls.close()

    def drain(self, seconds: float) -> None:
        """Answer with ``Connection: close`` from now on, and wait until every open
        connection has ended or ``seconds`` have passed."""
        with self._lock:
            self.draining = True
            self._closed.wait_for(lambda: not self._connections, timeout=seconds)

    def close_connections(self) -> None:
        """Wake every connection thread; each closes its own socket."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn)

    def handle_error(self, request, client_address) -> None:
        log.debug("webhook connection from %s failed", client_address, exc_info=True)


def _shutdown(conn: socket.socket) -> None:
    # The plain socket's shutdown: SSLSocket.shutdown would also drop its SSL object under
    # the feet of the thread that is using it.
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the apiserver reuses its connections
    # Headers and body go out as two writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms per review).
    disable_nagle_algorithm = True
    server_version = "training-operator-webhook"
    server: _TLSServer

    def do_GET(self) -> None:
        if urlsplit(self.path).path in HEALTH_PATHS:
            self._send(HTTPStatus.OK, b"ok", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")

    def do_POST(self) -> None:
        if urlsplit(self.path).path not in (VALIDATE_PATH, *RUNTIME_PATHS):
            self._drain_or_close()
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
            return
        body = self._read_body()
        if body is None:
            return
        webhook = self.server.webhook
        started = time.perf_counter()
        answer = review_json(body, webhook.lookups)
        elapsed = time.perf_counter() - started
        result = answer["response"]
        allowed = result["allowed"]
        reason = "" if allowed else result["status"]["reason"]
        if webhook.on_review is not None:
            try:
                webhook.on_review(elapsed, allowed, reason)
            except Exception:  # metrics must not break admission
                log.exception("on_review hook failed")
        # A body that is not an AdmissionReview is the caller's fault: say so in HTTP too.
        code = HTTPStatus.BAD_REQUEST if reason == "BadRequest" else HTTPStatus.OK
        self._send(code, json.dumps(answer).encode(), "application/json")

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.close_connection = True
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length")
            return None
        try:
            length = int(self.headers.get("Content-Length", ""))
            if length < 0:
                raise ValueError(length)
        except ValueError:
            self.close_connection = True
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "a valid Content-Length is required")
            return None
        limit = self.server.webhook.max_body_bytes
        if length > limit:
            # Read (and drop) a moderately oversized body so a client that only reads after
            # sending still sees the 413; anything bigger just gets the connection closed.
            if length <= DRAIN_FACTOR * limit:
                self._discard(length)
            self.close_connection = True  # the unread body must not be parsed as a request
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"body of {length} bytes exceeds the limit of "
                         f"{self.server.webhook.max_body_bytes} bytes")
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            return None
        return body

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                return
            length -= len(chunk)

    def _drain_or_close(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if 0 <= length <= self.server.webhook.max_body_bytes:
            self._discard(length)
        else:
            self.close_connection = True

    def _refuse(self, code: HTTPStatus, message: str) -> None:
        answer = response("", allowed=False, code=int(code), reason=code.phrase.replace(" ", ""),
                          message=message)
        self._send(code, json.dumps(answer).encode(), "application/json")

    def _send(self, code: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.server.draining:
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        log.debug("webhook %s: " + format, self.address_string(), *args)
