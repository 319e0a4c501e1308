"""A harness command of one provider never stops, changes or removes the clusters of the
other: it refuses their state directory, naming the provider that made it and the command
to use instead; `down` removes only what its own provider made."""

import subprocess
import sys
from pathlib import Path

import pytest

from clusters import cli
from clusters.kind import KindClusters, KindRecord, KindState
from clusters.local import ClusterRecord, HarnessState
from clusters.processes import harness_processes
from clusters.state_dir import save_state
from clusters.testing import eventually
from controller_kit.kubeclient import api_client


def clusters_cli(*args: str, state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusters", *args, "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=300, check=False,
    )


def run_cli(capsys, *args: str, state_dir: Path) -> tuple[int, str, str]:
    """The command line's main in this process (quicker than a subprocess where no
    cluster runs): exit status, stdout, stderr."""
    code = cli.main([*args, "--state-dir", str(state_dir)])
    out, err = capsys.readouterr()
    return code, out, err


def contents(directory: Path) -> dict[str, bytes | None]:
    """Every path under ``directory`` with a file's bytes (None for a directory)."""
    return {str(p.relative_to(directory)): None if p.is_dir() else p.read_bytes()
            for p in sorted(directory.rglob("*"))}


def readyz(kubeconfig: Path) -> str:
    """What the kubeconfig's apiserver answers on /readyz (its body when 200)."""
    with api_client(kubeconfig, request_timeout=5) as api:
        method, url, headers, _, _ = api.param_serialize("GET", "/readyz")
        response = api.call_api(method, url, header_params=headers, _request_timeout=(3, 5))
        response.read()
        return response.data.decode().strip() if response.status == 200 else \
            f"HTTP {response.status}"


def local_state_dir(directory: Path) -> Path:
    """A state directory as the local provider leaves it with a stopped manager (nothing
    runs), its cluster directory and kubeconfig beside."""
    save_state(directory / "state.json", HarnessState(clusters=[ClusterRecord(
        name="manager", role="manager", apiserver_port=1, etcd_client_port=2,
        etcd_peer_port=3, controller_manager_port=4, stopped=True)]))
    (directory / "manager" / "pki").mkdir(parents=True)
    (directory / "manager.kubeconfig").write_text("apiVersion: v1\n")
    (directory / ".lock").touch()
    return directory


def kind_state_dir(directory: Path, clusters: bool = True) -> Path:
    """A state directory as the kind provider leaves it (``clusters``: holding a manager
    and a worker; no container needs to exist, the refusals come first)."""
    records = [KindRecord(name="manager", role="manager"),
               KindRecord(name="worker-1", role="worker", worker_nodes=1)] if clusters else []
    save_state(directory / "kind-state.json", KindState(clusters=records))
    (directory / "worker-1.kind.yaml").write_text("kind: Cluster\n")
    (directory / "worker-1.internal.kubeconfig").write_text("apiVersion: v1\n")
    (directory / ".lock").touch()
    return directory


@pytest.mark.slow
def test_kind_commands_refuse_running_local_clusters_which_local_down_then_removes(tmp_path):
    state_dir = tmp_path / "local-clusters"
    try:
        up = clusters_cli("up", "--workers", "1", "--nodes", "1", state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        kubeconfigs = [state_dir / f"{name}.kubeconfig" for name in ("manager", "worker-1")]
        running = sorted(harness_processes(state_dir))
        assert running, "no harness process after `up`"
        before = sorted(p.name for p in state_dir.iterdir())

        down = clusters_cli("down", "--provider", "kind", state_dir=state_dir)
        assert down.returncode == 1, down.stdout
        assert f"{state_dir} was made by the local provider" in down.stderr, down.stderr
        assert f"use `python -m clusters down --state-dir {state_dir}`" in down.stderr
        assert "stopped and removed" not in down.stdout
        stop = clusters_cli("stop", "worker-1", "--provider", "kind", state_dir=state_dir)
        assert stop.returncode == 1
        assert f"use `python -m clusters stop worker-1 --state-dir {state_dir}`" in stop.stderr

        # Nothing was stopped or removed: the same processes, files and answering clusters.
        assert sorted(harness_processes(state_dir)) == running
        assert sorted(p.name for p in state_dir.iterdir()) == before
        for kubeconfig in kubeconfigs:
            eventually(lambda: readyz(kubeconfig), lambda body: body == "ok",
                       expected=f"{kubeconfig.stem}'s apiserver to answer /readyz ok",
                       timeout=10)
    finally:
        down = clusters_cli("down", state_dir=state_dir)
    assert down.returncode == 0, down.stderr
    assert f"stopped and removed {state_dir}" in down.stdout
    assert harness_processes(state_dir) == []
    assert not state_dir.exists()


@pytest.mark.parametrize("command", [
    ("up", "--workers", "1", "--max-workers", "1"), ("stop", "worker-1"),
    ("start", "worker-1"), ("down",), ("status",)])
def test_local_commands_refuse_a_kind_state_directory_and_change_nothing(
        tmp_path, capsys, command):
    state_dir = kind_state_dir(tmp_path / "kind")
    before = contents(state_dir)
    code, out, err = run_cli(capsys, *command, state_dir=state_dir)
    assert code == 1, out
    assert f"{state_dir} was made by the kind provider" in err, err
    if command[0] == "up":
        expected = f"`python -m clusters down --provider kind --state-dir {state_dir}`"
    else:
        expected = (f"use `python -m clusters {' '.join(command)} --provider kind "
                    f"--state-dir {state_dir}`")
    assert expected in err, err
    assert contents(state_dir) == before


@pytest.mark.parametrize("command", [
    ("up", "--workers", "1", "--max-workers", "1"), ("stop", "manager"), ("start", "manager"),
    ("down",), ("status",), ("deploy",)])
def test_kind_commands_refuse_a_local_state_directory_and_change_nothing(
        tmp_path, capsys, command):
    state_dir = local_state_dir(tmp_path / "local")
    before = contents(state_dir)
    code, out, err = run_cli(capsys, *command, "--provider", "kind", state_dir=state_dir)
    assert code == 1, out
    assert f"{state_dir} was made by the local provider" in err, err
    if command[0] in ("up", "deploy"):
        expected = f"`python -m clusters down --state-dir {state_dir}`"
    else:
        expected = f"use `python -m clusters {' '.join(command)} --state-dir {state_dir}`"
    assert expected in err, err
    assert contents(state_dir) == before


def test_a_directory_without_its_state_file_is_known_by_its_providers_own_files(
        tmp_path, capsys):
    local = local_state_dir(tmp_path / "local")
    (local / "state.json").unlink()
    kind = kind_state_dir(tmp_path / "kind")
    (kind / "kind-state.json").unlink()

    code, _, err = run_cli(capsys, "down", "--provider", "kind", state_dir=local)
    assert code == 1
    assert f"{local} was made by the local provider" in err, err
    code, _, err = run_cli(capsys, "down", state_dir=kind)
    assert code == 1
    assert f"{kind} was made by the kind provider" in err, err
    assert (local / "manager" / "pki").is_dir() and (kind / "worker-1.kind.yaml").is_file()


def test_each_down_removes_only_its_own_providers_part_of_a_directory_both_made(
        tmp_path, capsys):
    # As a kind `up` over a local state directory left it before the check existed (kind
    # with no clusters recorded, so its `down` needs no Docker engine).
    state_dir = kind_state_dir(local_state_dir(tmp_path / "both"), clusters=False)

    code, _, err = run_cli(capsys, "up", "--workers", "1", "--max-workers", "1",
                             state_dir=state_dir)
    assert code == 1
    assert "holds clusters of both the kind and the local providers" in err, err
    assert f"`python -m clusters down --provider kind --state-dir {state_dir}`" in err

    code, out, err = run_cli(capsys, "down", state_dir=state_dir)
    assert code == 0, err
    assert f"{state_dir} stays with the kind provider's" in out, out
    left = sorted(p.name for p in state_dir.iterdir())
    assert left == [".lock", "kind-state.json", "manager.kubeconfig",
                    "worker-1.internal.kubeconfig", "worker-1.kind.yaml"]

    assert KindClusters(state_dir).down() is True
    assert not state_dir.exists()


def test_down_leaves_a_directory_no_provider_made(tmp_path, capsys):
    state_dir = tmp_path / "notes"
    state_dir.mkdir()
    (state_dir / "notes.txt").write_text("mine\n")
    for provider in ("local", "kind"):
        code, out, err = run_cli(capsys, "down", "--provider", provider, state_dir=state_dir)
        assert code == 0, err
        assert f"no {provider} clusters in {state_dir}" in out, out
    assert (state_dir / "notes.txt").read_text() == "mine\n"
