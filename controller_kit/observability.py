"""The small HTTP servers of a process: /metrics (Prometheus text), /healthz and /readyz,
plus whatever read-only routes the process adds (e.g. the dispatcher's dashboard). The
secure metrics listener serves over TLS and lets in only the callers ``authorize`` allows
(metrics_auth.py), with its connections bounded (connection_limits.py); a host of ``::``
listens on IPv6 and IPv4 alike."""

from __future__ import annotations

import errno
import logging
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from controller_kit.connection_limits import ConnectionLimits, ConnectionPool
from controller_kit.metrics_auth import Decision

log = logging.getLogger(__name__)

# A route gets the query parameters and answers (HTTP status, content type, body).
Response = tuple[int, str, bytes]
Route = Callable[[dict[str, list[str]]], Response]
# Decides a request from its Authorization header and path.
Authorize = Callable[[str | None, str], Decision]
# (ok, detail) of a probe.
Check = Callable[[], tuple[bool, str]]

_BUILT_IN = ("/metrics", "/healthz", "/readyz")
_PROBES = ("/healthz", "/readyz")
# An idle keep-alive connection or a stuck TLS handshake is dropped after this long.
CONNECTION_TIMEOUT = 30.0
# Binding "::" fails so where the kernel has no IPv6; "0.0.0.0" then serves IPv4 alone.
NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ObservabilityServer:
    """/metrics from ``registry`` when it is given; /healthz and /readyz when ``ready`` is
    (``ready()`` returns (ok, detail); /readyz answers 200 with the detail when ok, else
    503; /healthz answers 200 unless ``live()`` says otherwise, then 500 with its detail); a
    built-in path without its source answers 404. ``routes`` maps further GET paths to
    handlers; the built-in paths cannot be replaced. With ``tls`` (the context for each new
    connection) it serves HTTPS, and with ``authorize`` every request must be allowed by
    it; such a listener serves no ``routes`` (nothing but metrics goes behind it). With
    ``limits`` its connections are served by a bounded pool, each within a deadline
    (``on_drop`` is told of each one closed unserved or cut); else a thread each."""

    def __init__(self, port: int, registry: CollectorRegistry | None,
                 ready: Check | None, host: str = "127.0.0.1",
                 routes: Mapping[str, Route] | None = None, *,
                 tls: Callable[[], ssl.SSLContext] | None = None,
                 authorize: Authorize | None = None, live: Check | None = None,
                 limits: ConnectionLimits | None = None,
                 on_drop: Callable[[str], None] | None = None):
        clash = sorted(set(routes or {}) & set(_BUILT_IN))
        if clash:
            raise ValueError(f"routes: {', '.join(clash)} is served by the server itself")
        if authorize is not None and routes:
            raise ValueError(f"routes: {', '.join(sorted(routes))} cannot be served on an "
                             "authenticated metrics listener")
        if authorize is not None and tls is None:
            raise ValueError("authorize: bearer tokens are accepted over TLS only")
        registry_ref, ready_ref, routes_ref = registry, ready, dict(routes or {})
        live_ref = live

        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT

            def do_GET(self):
                url = urlsplit(self.path)
                if authorize is not None:
                    decision = authorize(self.headers.get("Authorization"), url.path)
                    if not decision.allowed:
                        self._send(decision.status, decision.reason.encode(),
                                   challenge=decision.status == HTTPStatus.UNAUTHORIZED)
                        return
                if url.path == "/metrics" and registry_ref is not None:
                    self._send(200, generate_latest(registry_ref), CONTENT_TYPE_LATEST)
                elif url.path == "/healthz" and ready_ref is not None:
                    ok, detail = live_ref() if live_ref is not None else (True, "ok")
                    self._send(200 if ok else 500, detail.encode())
                elif url.path == "/readyz" and ready_ref is not None:
                    ok, detail = ready_ref()
                    self._send(200 if ok else 503, detail.encode())
                elif url.path in routes_ref:
                    try:
                        code, content_type, body = routes_ref[url.path](parse_qs(url.query))
                    except Exception as err:  # one bad page must not kill the server
                        log.exception("GET %s failed", url.path)
                        code, content_type, body = 500, "text/plain", (
                            f"GET {url.path}: {type(err).__name__}: {err}".encode())
                    self._send(code, body, content_type)
                else:
                    self._send(404, f"not found: {url.path}".encode())

            def _send(self, code: int, body: bytes, content_type: str = "text/plain",
                      challenge: bool = False) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                if challenge:
                    self.send_header("WWW-Authenticate", 'Bearer realm="metrics"')
                # Everything here describes the live process: never serve it from a cache,
                # and let nothing load from anywhere but this server.
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Content-Security-Policy", "default-src 'self'")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # probes every few seconds would flood the log
                return

        self._server = bind_server(host, port, Handler, tls, limits, on_drop,
                                   name="metrics-connection")
        # "::" where there is no IPv6 fell back to IPv4 alone.
        self.host = host if self._server.address_family == socket.AF_INET6 or host != "::" \
            else "0.0.0.0"
        self.port = self._server.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="observability", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{address(self.host, self.port)}"

    @property
    def thread(self) -> threading.Thread:
        """The thread that accepts connections (its lifecycle's manager watches it)."""
        return self._thread

    def start(self) -> ObservabilityServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._server.pool is not None:
            self._server.pool.close()


def bind_server(host: str, port: int, handler: type[BaseHTTPRequestHandler],
                tls: Callable[[], ssl.SSLContext] | None = None,
                limits: ConnectionLimits | None = None,
                on_drop: Callable[[str], None] | None = None,
                name: str = "connection") -> Server:
    """An HTTP server of ``handler`` bound to ``host``:``port`` (``::`` falls back to
    0.0.0.0 where the kernel has no IPv6), not started (``serve_forever``): over TLS with
    ``tls``, its connections served by a bounded pool with ``limits`` (threads named
    ``name``; the handler may move its connection's deadline with
    ``server.pool.set_deadline``), else a thread each."""
    try:
        server = Server((host, port), handler, tls)
    except OSError as err:
        if host != "::" or err.errno not in NO_IPV6:
            raise
        log.info("no IPv6 here (%s): listening on 0.0.0.0 (IPv4) only", err.strerror)
        server = Server(("0.0.0.0", port), handler, tls)
    if limits is not None:
        server.pool = ConnectionPool(limits, server.serve_connection, on_drop, name=name)
    return server


class Server(ThreadingHTTPServer):
    """The listener of ``bind_server``: TLS handshakes in the connection's own thread,
    connections handed to ``pool`` when it is set."""

    daemon_threads = True
    # Connections the kernel holds until accepted (socketserver's default is 5): a burst
    # is accepted and then served, or closed, by the pool rather than refused unseen.
    request_queue_size = 64

    def __init__(self, server_address, handler, tls: Callable[[], ssl.SSLContext] | None):
        self.tls = tls
        self.pool: ConnectionPool | None = None
        if ":" in server_address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(server_address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            # One socket for both families, whatever the kernel's bindv6only default.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would look up the host's FQDN: a DNS round trip never used.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address) -> None:
        if self.pool is None:
            super().process_request(request, client_address)  # a thread each
        else:
            self.pool.submit(request, client_address)  # never blocks the accept loop

    def serve_connection(self, request, client_address) -> None:
        """One pooled connection, served and closed."""
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - as socketserver does: logged, not raised
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def finish_request(self, request, client_address) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        # In the connection's own thread: a slow or broken handshake stalls no one else.
        request.settimeout(CONNECTION_TIMEOUT)
        try:
            conn = self.tls().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as err:
            log.debug("TLS handshake with %s failed: %s", client_address, err)
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def handle_error(self, request, client_address) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)
