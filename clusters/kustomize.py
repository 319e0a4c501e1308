"""The project's kustomize bases (``manifests/``) through the provisioned kubectl: render
a base, apply or dry-run it against a cluster. Tests use it to exercise the manifests
exactly as shipped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from clusters.binaries import find_binaries
from clusters.crds import manifests_dir


def kubectl(kubeconfig: Path | str | None, *args: str, stdin: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run kubectl (``--kubeconfig`` when given); the caller checks ``returncode``."""
    argv = [str(find_binaries(build=False, names=("kubectl",)).kubectl)]
    if kubeconfig is not None:
        argv.append(f"--kubeconfig={kubeconfig}")
    return subprocess.run([*argv, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)


def base_path(base: str) -> Path:
    """``manifests/<base>``, refusing a name that is not a kustomize base."""
    path = manifests_dir() / base
    if not (path / "kustomization.yaml").is_file():
        raise FileNotFoundError(f"manifests/{base}: no kustomization.yaml in {path}")
    return path


def render(base: str) -> list[dict]:
    """The objects ``kubectl kustomize manifests/<base>`` produces."""
    out = kubectl(None, "kustomize", str(base_path(base)))
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize manifests/{base} failed: {out.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def apply(kubeconfig: Path | str, objects: list[dict], *extra: str) -> str:
    """Server-side apply ``objects`` (``extra``: e.g. ``--dry-run=server``); return stdout."""
    out = kubectl(kubeconfig, "apply", "--server-side", "--field-manager=trainjob-manifests",
                  *extra, "-f", "-", stdin=yaml.safe_dump_all(objects))
    if out.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {out.stderr.strip()}")
    return out.stdout
