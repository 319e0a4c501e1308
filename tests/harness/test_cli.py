"""The `python -m clusters` command line: up, idempotent up, status, down and no leftovers."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusters.processes import GO_RUNTIME_DEFAULTS, harness_processes


def clusters_cli(*args: str, state_dir) -> subprocess.CompletedProcess:
    # Without Go runtime settings of the caller's, so that the harness's own are what is seen.
    env = {k: v for k, v in os.environ.items() if k not in GO_RUNTIME_DEFAULTS}
    return subprocess.run(
        [sys.executable, "-m", "clusters", *args, "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )


def go_runtime_settings(pid: int) -> dict[str, str]:
    """The Go runtime variables of the harness's defaults that process ``pid`` runs with."""
    environ = dict(e.decode().split("=", 1) for e in
                   Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    return {key: value for key, value in environ.items() if key in GO_RUNTIME_DEFAULTS}


@pytest.mark.slow
def test_up_status_down_lifecycle(tmp_path):
    state_dir = tmp_path / "cli-clusters"
    try:
        first = clusters_cli("up", "--workers", "1", "--json", state_dir=state_dir)
        assert first.returncode == 0, first.stderr
        clusters = json.loads(first.stdout)["clusters"]
        assert [(c["name"], c["role"], c["state"]) for c in clusters] == [
            ("manager", "manager", "running"), ("worker-1", "worker", "running")]
        for c in clusters:
            assert c["kubeconfig"] == str(state_dir / f"{c['name']}.kubeconfig")
            assert c["server"].startswith("https://127.0.0.1:")

        # The processes outlive the command that started them.
        started = harness_processes(state_dir)
        assert started, "no harness process running after `up` returned"
        # Each is a Go server told to collect garbage less often than Go's default, on half
        # the machine's cores.
        half = str(max(1, (os.cpu_count() or 1) // 2))
        settings = {pid: go_runtime_settings(pid) for pid in started}
        wrong = {pid: found for pid, found in settings.items()
                 if found != {"GOGC": "400", "GOMAXPROCS": half}}
        assert not wrong, f"harness processes not at GOGC=400 GOMAXPROCS={half}: {wrong}"
        # And each leads a session of its own, away from the terminal `up` ran in.
        leaders = {pid: os.getsid(pid) for pid in started}
        assert all(pid == sid for pid, sid in leaders.items()), (
            f"expected each process to lead its session, saw pid: session {leaders}")

        # Again while up: a no-op that reports the same clusters.
        again = clusters_cli("up", "--workers", "1", "--json", state_dir=state_dir)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["clusters"] == clusters

        # Asking for a different layout over a running one is refused, and changes nothing.
        other = clusters_cli("up", "--workers", "3", state_dir=state_dir)
        assert other.returncode == 1
        assert "already holds clusters ['manager', 'worker-1']" in other.stderr
        status = clusters_cli("status", "--json", state_dir=state_dir)
        assert json.loads(status.stdout)["clusters"] == clusters

        # Kubeconfigs embed their certificates so they can be stored in a Secret as they are.
        config = yaml.safe_load((state_dir / "worker-1.kubeconfig").read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        assert set(cluster) == {"server", "certificate-authority-data"}
        assert set(user) == {"client-certificate-data", "client-key-data"}
        assert base64.b64decode(cluster["certificate-authority-data"]).startswith(
            b"-----BEGIN CERTIFICATE-----")
    finally:
        down = clusters_cli("down", state_dir=state_dir)
    assert down.returncode == 0, down.stderr
    assert harness_processes(state_dir) == []
    assert not state_dir.exists()


def test_stop_of_an_unknown_cluster_names_the_known_ones(tmp_path):
    result = clusters_cli("stop", "worker-9", state_dir=tmp_path / "empty")
    assert result.returncode == 1
    assert "no cluster named 'worker-9'" in result.stderr
    assert "run `up` first" in result.stderr


def test_upstream_crds_for_an_unknown_cluster_is_refused_before_anything_starts(tmp_path):
    state_dir = tmp_path / "refused"
    result = clusters_cli("up", "--workers", "1", "--upstream-crds", "worker-9",
                          state_dir=state_dir)
    assert result.returncode == 1
    assert "--upstream-crds worker-9: no such cluster; clusters: manager, worker-1" \
        in result.stderr, result.stderr
    assert harness_processes(state_dir) == []


def test_help_explains_the_commands():
    result = subprocess.run([sys.executable, "-m", "clusters", "--help"],
                            capture_output=True, text=True, check=True)
    for word in ("up", "status", "down", "stop", "start", "provision", "KUBEBUILDER_ASSETS"):
        assert word in result.stdout


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`python -m clusters status | head`: the reader has gone before the output comes."""
    proc = subprocess.Popen([sys.executable, "-m", "clusters", "status", "--state-dir",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # long before the interpreter has started and prints
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()


@pytest.mark.parametrize("args, named", [
    (("deploy",), "deploy: only with --provider kind"),
    (("demo", "--provider", "kind"), "demo: only with the local provider"),
    (("conformance", "--provider", "kind"), "conformance: only with the local provider"),
])
def test_commands_a_provider_cannot_serve_are_refused_and_start_nothing(tmp_path, args, named):
    state_dir = tmp_path / "state"
    result = clusters_cli(*args, state_dir=state_dir)
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"error: {named}"), result.stderr
    assert not state_dir.exists()


def test_deploy_into_no_clusters_says_what_to_run_first(tmp_path):
    result = clusters_cli("deploy", "--provider", "kind", state_dir=tmp_path / "state")
    assert result.returncode == 1, result
    assert "no kind clusters to deploy into; run `python -m clusters up --provider kind` " \
        "first" in result.stderr, result.stderr
