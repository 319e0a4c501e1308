"""A port already taken is reported with its address and the flag to change, for the
metrics, health and dashboard server of each command (the operator's webhook port:
``tests/operator/test_webhook.py``)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

# Nothing listens on port 1: the commands never get to talk to it, they fail at the listen.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.fixture
def taken_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def kubeconfig(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("module, what", [
    ("training_operator", "metrics and health"),
    ("dispatcher", "metrics and health and the dashboard"),
])
def test_metrics_port_taken(module, what, kubeconfig, taken_port):
    result = _run(module, "run", "--kubeconfig", str(kubeconfig),
                  "--metrics-port", str(taken_port))
    assert result.returncode == 1, result.stderr
    assert (f"error: cannot listen on 127.0.0.1:{taken_port} for {what}: Address already in "
            "use (another process listens there; choose another port with --metrics-port)"
            ) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_dashboard_port_taken(kubeconfig, taken_port):
    """With metrics on every interface the dashboard has a listener of its own; a taken
    port is named with its own flag."""
    result = _run("dispatcher", "run", "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
                  "--metrics-host", "0.0.0.0", "--dashboard-port", str(taken_port))
    assert result.returncode == 1, result.stderr
    assert (f"error: cannot listen on 127.0.0.1:{taken_port} for the dashboard: Address "
            "already in use (another process listens there; choose another port with "
            "--dashboard-port)") in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
