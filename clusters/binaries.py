"""Provisioning of the control-plane binaries: etcd, kube-apiserver, kube-controller-manager,
plus kubectl (the manifests are checked with ``kubectl apply --dry-run=server -k``).

Lookup order for each binary:
  1. an explicit path in the environment (``TEST_ASSET_ETCD``, ``TEST_ASSET_KUBE_APISERVER``,
     ``TEST_ASSET_KUBE_CONTROLLER_MANAGER``, ``TEST_ASSET_KUBECTL``: the names envtest users
     already know);
  2. a ``KUBEBUILDER_ASSETS`` directory, as ``setup-envtest`` produces;
  3. the cache (``$CLUSTERS_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainjob-dispatcher``, else
     ``~/.cache/trainjob-dispatcher``), keyed by version;
  4. otherwise it is built from Go modules into the cache.

Building: ``k8s.io/kubernetes`` replaces its staging modules with local paths, so it cannot be
``go install``-ed; a scratch module requires it and replaces every staging module with its
published ``v0.<minor>.<patch>`` twin. etcd is built the same way from ``go.etcd.io/etcd/server/v3``.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.5"
# Oldest Go that k8s.io/kubernetes v1.34 accepts (its go.mod says "go 1.24.0").
GO_DIRECTIVE = "1.24.0"

# The staging modules that k8s.io/kubernetes v1.34 replaces with ./staging paths.
STAGING_MODULES = (
    "api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
    "cloud-provider", "cluster-bootstrap", "code-generator", "component-base",
    "component-helpers", "controller-manager", "cri-api", "cri-client", "csi-translation-lib",
    "dynamic-resource-allocation", "endpointslice", "externaljwt", "kms", "kube-aggregator",
    "kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl", "kubelet", "metrics",
    "mount-utils", "pod-security-admission", "sample-apiserver", "sample-cli-plugin",
    "sample-controller",
)

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kubectl")
ENV_OVERRIDES = {
    "etcd": "TEST_ASSET_ETCD",
    "kube-apiserver": "TEST_ASSET_KUBE_APISERVER",
    "kube-controller-manager": "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
    "kubectl": "TEST_ASSET_KUBECTL",
}


class ProvisioningError(RuntimeError):
    """A binary could neither be found nor built; the message says what to do."""


@dataclass(frozen=True)
class ControlPlaneBinaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path

    def as_dict(self) -> dict[str, str]:
        return {
            "etcd": str(self.etcd),
            "kube-apiserver": str(self.kube_apiserver),
            "kube-controller-manager": str(self.kube_controller_manager),
            "kubectl": str(self.kubectl),
        }


def cache_root() -> Path:
    if explicit := os.environ.get("CLUSTERS_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainjob-dispatcher"


def cached_path(binary: str) -> Path:
    if binary == "etcd":
        return cache_root() / f"etcd-{ETCD_VERSION}" / "etcd"
    return cache_root() / f"kubernetes-{KUBERNETES_VERSION}" / binary


def _from_environment(binary: str) -> Path | None:
    if explicit := os.environ.get(ENV_OVERRIDES[binary]):
        path = Path(explicit)
        if not _is_executable(path):
            raise ProvisioningError(
                f"{ENV_OVERRIDES[binary]}={explicit}: not an executable file"
            )
        return path
    if assets := os.environ.get("KUBEBUILDER_ASSETS"):
        path = Path(assets) / binary
        # setup-envtest ships etcd, kube-apiserver and kubectl but not
        # kube-controller-manager; a missing one falls through to the cache or a build.
        if _is_executable(path):
            return path
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_binaries(build: bool = True) -> ControlPlaneBinaries:
    """Return the binaries, building what is missing into the cache when ``build``."""
    found: dict[str, Path] = {}
    missing_kube: list[str] = []
    # A broken explicit override is reported before anything is looked up or built.
    overrides = {binary: _from_environment(binary) for binary in ("etcd", *KUBE_COMMANDS)}
    for binary, path in overrides.items():
        if path is None and _is_executable(cached_path(binary)):
            path = cached_path(binary)
        if path is None:
            if not build:
                raise ProvisioningError(
                    f"{binary} not found: set {ENV_OVERRIDES[binary]} or KUBEBUILDER_ASSETS, "
                    f"or run `python -m clusters provision` to build it into {cached_path(binary)}"
                )
            if binary == "etcd":
                path = build_etcd()
            else:
                missing_kube.append(binary)
                continue
        found[binary] = path
    if missing_kube:
        found.update(build_kubernetes(missing_kube))
    return ControlPlaneBinaries(
        etcd=found["etcd"],
        kube_apiserver=found["kube-apiserver"],
        kube_controller_manager=found["kube-controller-manager"],
        kubectl=found["kubectl"],
    )


def binary_version(path: Path) -> str:
    """The version string a binary reports about itself (``--version``)."""
    # kubectl has no --version flag; its client version is a subcommand.
    args = ["version", "--client"] if path.name == "kubectl" else ["--version"]
    out = subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=30, check=False
    )
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


# --- building -------------------------------------------------------------------------


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ProvisioningError(
            "Go is needed to build the control-plane binaries and is not on PATH. Install Go "
            f">= {GO_DIRECTIVE[:4]}, or point KUBEBUILDER_ASSETS / TEST_ASSET_* at existing binaries."
        )
    return go


def _run_go(args: list[str], workdir: Path, extra_env: dict[str, str] | None = None) -> None:
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    env["CGO_ENABLED"] = "0"
    # A user's GOFLAGS such as -mod=vendor would break the scratch module.
    env["GOFLAGS"] = "-mod=mod"
    env.update(extra_env or {})
    log.info("running %s in %s", " ".join(args), workdir)
    proc = subprocess.run(
        [_go(), *args], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise ProvisioningError(
            f"`go {' '.join(args)}` failed in {workdir} (exit {proc.returncode}):\n{tail}"
        )


@contextlib.contextmanager
def _build_lock(name: str):
    """Serialise builds of one artifact across processes (two `make` targets at once)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _scratch_module(workdir: Path, module: str, requires: str, replaces: list[str],
                    imports: list[str]) -> None:
    lines = [f"module {module}", "", f"go {GO_DIRECTIVE}", "", "godebug default=go1.24", "",
             f"require {requires}", ""]
    lines += [f"replace {r}" for r in replaces]
    (workdir / "go.mod").write_text("\n".join(lines) + "\n")
    # A build-tagged file pins the commands as dependencies so `go mod tidy` resolves them.
    body = "\n".join(f'\t_ "{imp}"' for imp in imports)
    (workdir / "tools.go").write_text(
        f"//go:build tools\n\npackage tools\n\nimport (\n{body}\n)\n"
    )


def _version_ldflags(version: str) -> str:
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise ProvisioningError(f"cannot parse Kubernetes version {version!r}")
    major, minor, _ = match.groups()
    build_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    values = {
        "gitVersion": version, "gitMajor": major, "gitMinor": minor,
        "gitTreeState": "clean", "buildDate": build_date,
        # The module proxy does not tell the source commit; empty beats the "$Format:%H$"
        # placeholder the sources carry.
        "gitCommit": "",
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def build_kubernetes(commands: list[str] | tuple[str, ...] = KUBE_COMMANDS) -> dict[str, Path]:
    """Build the given k8s.io/kubernetes commands into the cache; return their paths."""
    staging_version = "v0" + KUBERNETES_VERSION[2:]
    with _build_lock(f"kubernetes-{KUBERNETES_VERSION}"):
        wanted = [c for c in commands if not _is_executable(cached_path(c))]
        if wanted:
            target_dir = cached_path(commands[0]).parent
            target_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="build-", dir=cache_root()) as tmp:
                workdir = Path(tmp)
                _scratch_module(
                    workdir,
                    "trainjob.local/controlplane",
                    f"k8s.io/kubernetes {KUBERNETES_VERSION}",
                    [f"k8s.io/{m} => k8s.io/{m} {staging_version}" for m in STAGING_MODULES],
                    [f"k8s.io/kubernetes/cmd/{c}" for c in wanted],
                )
                _run_go(["mod", "tidy"], workdir)
                out = workdir / "out"
                out.mkdir()
                _run_go(
                    ["build", "-trimpath", "-ldflags", _version_ldflags(KUBERNETES_VERSION),
                     "-o", str(out) + "/", *[f"k8s.io/kubernetes/cmd/{c}" for c in wanted]],
                    workdir,
                )
                for command in wanted:
                    # rename is atomic: a reader never sees a half-written binary.
                    os.replace(out / command, cached_path(command))
    return {c: cached_path(c) for c in commands}


def build_etcd() -> Path:
    """Build etcd into the cache; return its path."""
    target = cached_path("etcd")
    with _build_lock(f"etcd-{ETCD_VERSION}"):
        if not _is_executable(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="build-", dir=cache_root()) as tmp:
                workdir = Path(tmp)
                _scratch_module(
                    workdir, "trainjob.local/etcd",
                    f"go.etcd.io/etcd/server/v3 {ETCD_VERSION}", [], ["go.etcd.io/etcd/server/v3"],
                )
                _run_go(["mod", "tidy"], workdir)
                _run_go(
                    ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(workdir / "etcd"),
                     "go.etcd.io/etcd/server/v3"],
                    workdir,
                )
                os.replace(workdir / "etcd", target)
    return target
