"""One small HTTP server per process for /metrics (Prometheus text), /healthz and /readyz,
plus whatever read-only routes the process adds (e.g. the dispatcher's dashboard)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# A route gets the query parameters and answers (HTTP status, content type, body).
Response = tuple[int, str, bytes]
Route = Callable[[dict[str, list[str]]], Response]

_BUILT_IN = ("/metrics", "/healthz", "/readyz")


class ObservabilityServer:
    """``ready()`` returns (ok, detail); /readyz answers 200 with the detail when ok.
    ``routes`` maps further GET paths to handlers; the built-in paths cannot be replaced.
    Without ``registry`` and ``ready`` the server answers ``routes`` only (a listener of
    their own, e.g. for a dashboard kept off the interfaces metrics are served on)."""

    def __init__(self, port: int, registry: CollectorRegistry | None,
                 ready: Callable[[], tuple[bool, str]] | None, host: str = "127.0.0.1",
                 routes: Mapping[str, Route] | None = None):
        clash = sorted(set(routes or {}) & set(_BUILT_IN))
        if clash:
            raise ValueError(f"routes: {', '.join(clash)} is served by the server itself")
        registry_ref, ready_ref, routes_ref = registry, ready, dict(routes or {})
        built_in = registry is not None and ready is not None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                url = urlsplit(self.path)
                if not built_in and url.path in _BUILT_IN:
                    self._send(404, f"not found: {url.path}".encode())
                elif url.path == "/metrics":
                    self._send(200, generate_latest(registry_ref), CONTENT_TYPE_LATEST)
                elif url.path == "/healthz":
                    self._send(200, b"ok")
                elif url.path == "/readyz":
                    ok, detail = ready_ref()
                    self._send(200 if ok else 503, detail.encode())
                elif url.path in routes_ref:
                    try:
                        code, content_type, body = routes_ref[url.path](parse_qs(url.query))
                    except Exception as err:  # noqa: BLE001 - one bad page must not kill the server
                        log.exception("GET %s failed", url.path)
                        code, content_type, body = 500, "text/plain", (
                            f"GET {url.path}: {type(err).__name__}: {err}".encode())
                    self._send(code, body, content_type)
                else:
                    self._send(404, f"not found: {url.path}".encode())

            def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                # Everything here describes the live process: never serve it from a cache,
                # and let nothing load from anywhere but this server.
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Content-Security-Policy", "default-src 'self'")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # probes every few seconds would flood the log
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="observability", daemon=True)

    def start(self) -> ObservabilityServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
