"""Where the dispatcher listens, run as the shipped Deployment runs it: metrics and health
on every interface (probes, scraping), the dashboard and /api/state (every job, no
authentication) on a listener of their own on loopback."""

from __future__ import annotations

import http.client
from pathlib import Path

from clusters.controlplane import free_port

MISSING_CONFIG = "no-such-multikueue-config"  # no workers: this dispatcher places nothing


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def listening_addresses(port: int) -> set[str]:
    """The local addresses sockets listen on at ``port`` (IPv4, from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_metrics_on_every_interface_leave_the_dashboard_on_loopback(multicluster,
                                                                    run_dispatcher):
    dashboard = free_port()
    dispatcher = run_dispatcher(multicluster.manager, "--metrics-host", "0.0.0.0",
                                "--dashboard-port", str(dashboard),
                                "--multikueue-config", MISSING_CONFIG)
    metrics = dispatcher.metrics_port
    assert listening_addresses(metrics) == {"0.0.0.0"}
    assert listening_addresses(dashboard) == {"127.0.0.1"}
    assert {path: get(metrics, path) for path in ("/metrics", "/healthz", "/readyz", "/",
                                                  "/api/state")} == {
        "/metrics": 200, "/healthz": 200, "/readyz": 200, "/": 404, "/api/state": 404}
    assert {path: get(dashboard, path) for path in ("/", "/api/state", "/app.js",
                                                    "/metrics", "/readyz")} == {
        "/": 200, "/api/state": 200, "/app.js": 200, "/metrics": 404, "/readyz": 404}


def test_metrics_on_loopback_keep_the_dashboard_beside_them(multicluster, run_dispatcher):
    """Run by hand (the defaults), one loopback port serves both, as before."""
    dispatcher = run_dispatcher(multicluster.manager, "--multikueue-config", MISSING_CONFIG)
    assert listening_addresses(dispatcher.metrics_port) == {"127.0.0.1"}
    assert [get(dispatcher.metrics_port, path) for path in ("/metrics", "/", "/api/state")] \
        == [200, 200, 200]
