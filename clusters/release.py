"""``python -m clusters release`` (``make release VERSION=...``): one file per installable
base of ``manifests/``, with the image references set, for ``kubectl apply --server-side -f``
as Kueue's and JobSet's releases are installed: every base each kind of cluster takes
(``INSTALLS``), and nothing else.

Each file is ``kubectl kustomize`` of a small overlay made here over the shipped base, whose
``images:`` point the project's two images at ``<registry>/<name>:<version>`` (kustomize's
own way to set them, so nothing but the image references differs from the base), and whose
worker Secret list is the one given, when given. The CRDs stay files of their own, as in
the manifests: no deploy file carries one.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from clusters import kustomize

# The bases a release ships, in install order, with what each is for (the file's header).
BASES = {
    "crds": "the TrainJob CRDs, only for a cluster without upstream Trainer's",
    "multikueue-crds": "the MultiKueue CRDs, only for a manager without Kueue",
    "worker": "a worker for a standalone dispatcher: the project's namespace there, the "
              "training operator and the dispatcher's identity that writes its copies",
    "worker-kueue": "a worker for a Kueue-mode dispatcher: the project's namespace there, the "
                    "training operator and the dispatcher's read-only identity (Kueue writes "
                    "the copies with its own)",
    "worker-namespace": "the project's namespace on a worker, alone: apply it before "
                        "worker-access.yaml or worker-reader.yaml, remove it after them",
    "operator-cert-manager": "a worker's training operator with cert-manager's certificate "
                             "(with worker-namespace.yaml and worker-access.yaml or "
                             "worker-reader.yaml, instead of worker.yaml or worker-kueue.yaml)",
    "worker-access": "the standalone dispatcher's identity on a worker, alone (in "
                     "worker-namespace.yaml's namespace)",
    "worker-reader": "the Kueue-mode dispatcher's read-only identity on a worker, alone (in "
                     "worker-namespace.yaml's namespace; after worker.yaml on a worker both "
                     "kinds of dispatcher use)",
    "manager": "a manager without Kueue",
    "manager-beside-kueue": "a manager running Kueue, the dispatcher standalone beside it",
    "manager-kueue": "a manager running Kueue, the dispatcher as its external dispatcher",
}
# What each kind of cluster applies, in this order (and removes in the reverse order): a
# base may need the namespace of one before it, never the other way round, and no two bases
# of one installation declare the same object, so removing one removes nothing of another
# (tests/harness/test_manifests.py). ``crds`` only where no Trainer CRDs are installed.
INSTALLS = {
    "worker, standalone dispatcher": ("crds", "worker"),
    "worker, Kueue-mode dispatcher": ("crds", "worker-kueue"),
    "worker for both kinds of dispatcher": ("crds", "worker", "worker-reader"),
    "worker with cert-manager, standalone dispatcher": (
        "crds", "worker-namespace", "operator-cert-manager", "worker-access"),
    "worker with cert-manager, Kueue-mode dispatcher": (
        "crds", "worker-namespace", "operator-cert-manager", "worker-reader"),
    "worker with cert-manager, both kinds of dispatcher": (
        "crds", "worker-namespace", "operator-cert-manager", "worker-access", "worker-reader"),
    "manager without Kueue": ("crds", "multikueue-crds", "manager"),
    "manager running Kueue, the dispatcher beside it": ("crds", "manager-beside-kueue"),
    "manager running Kueue, the dispatcher in Kueue mode": ("crds", "manager-kueue"),
}
# The images the bases reference, by the name they are built under (clusters.images).
IMAGES = ("trainjob-dispatcher", "training-operator")
WORKER_SECRETS_ROLE = "trainjob-dispatcher-worker-secrets"
# A version as an image tag allows it: letters, digits, '_', '.', '-', at most 128.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# A registry and repository path, e.g. registry.example.com:5000/team/ml.
_REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.:_-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*")
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class Release:
    """What to write: the version (image tag), where the images are pulled from, and the
    worker kubeconfig Secrets the dispatcher may read (empty: the shipped sample list)."""

    version: str
    registry: str
    worker_secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _TAG.fullmatch(self.version):
            raise ValueError(f"--version {self.version!r}: not a valid image tag (letters, "
                             "digits, '_', '.' and '-', at most 128, not starting with '.' "
                             "or '-')")
        if not _REGISTRY.fullmatch(self.registry):
            raise ValueError(f"--registry {self.registry!r}: not a registry and repository "
                             "path (e.g. registry.example.com/team), lower case, no scheme "
                             "and no trailing '/'")
        bad = [name for name in self.worker_secrets if not _SECRET_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"--worker-secret {', '.join(bad)}: not a valid Secret name "
                             "(lower case letters, digits, '-' and '.')")

    def image(self, name: str) -> str:
        return f"{self.registry}/{name}:{self.version}"


def _overlay(directory: Path, base: str, release: Release) -> Path:
    """A kustomization over ``manifests/<base>`` setting the images (and the Secret list)."""
    settings: dict = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize takes a base by a path relative to the overlay.
        "resources": [os.path.relpath(kustomize.base_path(base), directory / base)],
        "images": [{"name": name, "newName": f"{release.registry}/{name}",
                    "newTag": release.version} for name in IMAGES],
    }
    if release.worker_secrets:
        settings["patches"] = [{
            "target": {"kind": "Role", "name": WORKER_SECRETS_ROLE},
            "patch": yaml.safe_dump([{"op": "replace", "path": "/rules/0/resourceNames",
                                      "value": list(release.worker_secrets)}])}]
    overlay = directory / base
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    return overlay


def render(base: str, release: Release) -> str:
    """The release file of ``manifests/<base>``: a header, then the objects."""
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        out = kustomize.kubectl(None, "kustomize", str(_overlay(Path(tmp), base, release)))
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize manifests/{base} failed: {out.stderr.strip()}")
    header = (f"# trainjob-dispatcher {release.version}: {BASES[base]}.\n"
              f"# Rendered from manifests/{base}; install with\n"
              f"#   kubectl apply --server-side -f {base}.yaml\n")
    return header + out.stdout


def write_release(release: Release, out_dir: Path) -> list[Path]:
    """Write ``<base>.yaml`` for every base of ``BASES`` into ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for base in BASES:
        path = out_dir / f"{base}.yaml"
        path.write_text(render(base, release))
        written.append(path)
    return written
