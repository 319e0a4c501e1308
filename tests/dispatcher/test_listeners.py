"""Where the dispatcher listens, run as the shipped Deployment runs it: metrics and health
on every interface (probes, scraping), the dashboard and /api/state (every job, no
authentication) on a listener of their own on loopback; and what its liveness probe says
when its loop is stuck."""

from __future__ import annotations

import http.client
import os
import signal
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from clusters import fixtures
from clusters.controlplane import free_port
from clusters.testing import eventually, plain_get
from trainjob import constants as c

from dispatch_helpers import TRAINER, create, trainjob
from dispatch_helpers import get as get_object

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


def test_liveness_fails_while_the_loop_is_stuck_and_recovers_with_it(multicluster, namespace,
                                                                      run_dispatcher):
    """/healthz on the probe port answers 500 once keys have waited longer than
    --liveness-stall-timeout with no reconcile worker taking one, and 200 again once they are
    taken. Stuck for real: the one reconcile worker waits on a worker apiserver that was
    stopped (SIGSTOP: the connection stays open and nothing answers) while more jobs queue
    up behind it; the apiserver resumed, the loop goes on."""
    manager, worker = multicluster.manager, multicluster["worker-1"]
    config = runtime = node = f"liveness-{namespace}"
    fixtures.register_worker(manager.api, "worker-1", worker.kubeconfig)
    fixtures.register_config(manager.api, config, ["worker-1"])
    fixtures.add_node(worker.api, node, {"cpu": "16", "memory": "64Gi", "pods": "100"})
    fixtures.install_runtime(worker.api, fixtures.torch_runtime(runtime, cpu="100m",
                                                                memory="128Mi"))
    probes = free_port()
    dispatcher = run_dispatcher(manager, "--multikueue-config", config, "--workers", "1",
                                "--liveness-stall-timeout", "3", "--health-probe-port",
                                str(probes))
    jobs = ["canary"] + [f"stuck-{i}" for i in range(3)]
    apiserver = next(r for r in multicluster.harness.load().clusters
                     if r.name == "worker-1").pids["kube-apiserver"]
    try:
        # The loop works end to end first: a job placed on worker-1, its copy created there.
        create(manager, namespace, trainjob("canary", runtime=runtime))
        eventually(lambda: (get_object(manager, namespace, "canary")["metadata"].get(
                       "annotations") or {}).get(c.PLACEMENT_ANNOTATION),
                   lambda placed: placed == "worker-1", timeout=60,
                   expected=f"the canary placed on worker-1 (log: {dispatcher.log_file})")
        eventually(lambda: get_object(worker, namespace, "canary"), lambda copy: bool(copy),
                   timeout=30, expected="the canary's copy on worker-1")
        assert plain_get(probes, "/healthz") == (200, "ok")
        os.kill(apiserver, signal.SIGSTOP)
        try:
            for name in jobs[1:]:
                create(manager, namespace, trainjob(name, runtime=runtime))
            _, detail = eventually(lambda: plain_get(probes, "/healthz"),
                                      lambda answer: answer[0] == 500, timeout=25,
                                      expected="/healthz 500 while the loop is stuck "
                                      f"(log: {dispatcher.log_file})")
            assert "reconcile workers of dispatch stuck:" in detail, detail
            assert "--liveness-stall-timeout 3 s" in detail, detail
            assert plain_get(probes, "/readyz")[0] == 200, "stuck is not unready"
        finally:
            os.kill(apiserver, signal.SIGCONT)
        eventually(lambda: plain_get(probes, "/healthz"), lambda answer: answer == (200, "ok"),
                   timeout=30, expected="/healthz 200 once the loop takes keys again")
    finally:
        for name in jobs:
            try:
                manager.custom.delete_namespaced_custom_object(
                    *TRAINER, namespace, c.TRAINJOBS, name)
            except ApiException as err:
                if err.status != 404:
                    raise
        # The dispatcher takes its finalizers off and the copies away before it stops.
        eventually(lambda: [n for n in jobs if get_object(manager, namespace, n) is not None],
                   lambda left: left == [], timeout=60,
                   expected="the jobs gone, the dispatcher's finalizers with them")
        custom = manager.custom
        custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                            c.MULTIKUEUECONFIGS, config)
        worker.custom.delete_cluster_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, c.CLUSTERTRAININGRUNTIMES, runtime)
        fixtures.remove_node(worker.api, node)
    assert dispatcher.proc.poll() is None
