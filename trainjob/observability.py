"""One small HTTP server per process for /metrics (Prometheus text), /healthz and /readyz."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class ObservabilityServer:
    """``ready()`` returns (ok, detail); /readyz answers 200 with the detail when ok."""

    def __init__(self, port: int, registry: CollectorRegistry,
                 ready: Callable[[], tuple[bool, str]], host: str = "127.0.0.1"):
        registry_ref, ready_ref = registry, ready

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(registry_ref), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok")
                elif path == "/readyz":
                    ok, detail = ready_ref()
                    self._send(200 if ok else 503, detail.encode())
                else:
                    self._send(404, b"not found")

            def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
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
