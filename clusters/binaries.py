"""Provisioning of every binary the harness runs: the control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kubectl) and the upstream controllers that run
beside it (the JobSet controller and kwok on every worker; the Kubeflow Trainer controller
and Kueue for the tests that need them).

Every version is pinned in ``COMPONENTS`` below and nowhere else.

Lookup order for each binary:
  1. an explicit path in the environment (``TEST_ASSET_<NAME>``, e.g. ``TEST_ASSET_ETCD``,
     ``TEST_ASSET_KUBE_APISERVER``, ``TEST_ASSET_JOBSET``: the names envtest users know);
  2. a ``KUBEBUILDER_ASSETS`` directory, as ``setup-envtest`` produces (control plane only);
  3. the cache (``$CLUSTERS_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainjob-dispatcher``, else
     ``~/.cache/trainjob-dispatcher``), keyed by version;
  4. otherwise it is built from Go modules into the cache.

Building: ``k8s.io/kubernetes`` replaces its staging modules with local paths, so it cannot be
``go install``-ed; a scratch module requires it and replaces every staging module with its
published ``v0.<minor>.<patch>`` twin. etcd is built the same way from
``go.etcd.io/etcd/server/v3``. The upstream controllers build with ``go get`` + ``go build``
in a scratch module each, with no replace directives. Their CRDs and configuration files are
read from the same downloaded module in the Go module cache (``module_dir``), never copied.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from controller_kit.api_time import format_time

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


@dataclass(frozen=True)
class Component:
    """One binary: where it comes from and which version is pinned."""

    name: str
    kind: str  # "kubernetes", "etcd" or "module" (go get + go build of a published module)
    version: str
    env_var: str
    module: str = ""
    package: str = ""
    # -X target that stamps the version into the binary, where the project has one.
    version_variable: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def source(self) -> str:
        if self.kind == "kubernetes":
            return f"k8s.io/kubernetes {self.version}"
        if self.kind == "etcd":
            return f"go.etcd.io/etcd/server/v3 {self.version}"
        return f"{self.module} {self.version}"


def _kube(name: str) -> Component:
    return Component(name, "kubernetes", KUBERNETES_VERSION,
                     "TEST_ASSET_" + name.upper().replace("-", "_"))


COMPONENTS: dict[str, Component] = {c.name: c for c in (
    Component("etcd", "etcd", ETCD_VERSION, "TEST_ASSET_ETCD"),
    _kube("kube-apiserver"),
    _kube("kube-controller-manager"),
    _kube("kube-scheduler"),
    _kube("kubectl"),
    Component("jobset-controller", "module", "v0.12.0", "TEST_ASSET_JOBSET",
              module="sigs.k8s.io/jobset", package="sigs.k8s.io/jobset",
              version_variable="sigs.k8s.io/jobset/pkg/version.GitVersion"),
    Component("kwok", "module", "v0.8.0", "TEST_ASSET_KWOK",
              module="sigs.k8s.io/kwok", package="sigs.k8s.io/kwok/cmd/kwok"),
    Component("trainer-controller-manager", "module", "v2.3.0", "TEST_ASSET_TRAINER",
              module="github.com/kubeflow/trainer/v2",
              package="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"),
    # Generates CRDs from upstream API types that are published only as Go code (Volcano's
    # PodGroup: see ``generated_crds``).
    Component("controller-gen", "module", "v0.19.0", "TEST_ASSET_CONTROLLER_GEN",
              module="sigs.k8s.io/controller-tools",
              package="sigs.k8s.io/controller-tools/cmd/controller-gen"),
    # sigs.k8s.io/scheduler-library's checksum is not in the checksum database.
    Component("kueue", "module", "v0.19.2", "TEST_ASSET_KUEUE",
              module="sigs.k8s.io/kueue", package="sigs.k8s.io/kueue/cmd/kueue",
              version_variable="sigs.k8s.io/kueue/pkg/version.GitVersion",
              extra_env={"GONOSUMDB": "sigs.k8s.io/scheduler-library"}),
    # Docker CLI plugins, for a docker client that lacks them (clusters/engine.py): BuildKit
    # builds with secrets, and docker compose.
    Component("docker-buildx", "module", "v0.38.2", "TEST_ASSET_DOCKER_BUILDX",
              module="github.com/docker/buildx", package="github.com/docker/buildx/cmd/buildx",
              version_variable="github.com/docker/buildx/version.Version"),
    Component("docker-compose", "module", "v2.40.3", "TEST_ASSET_DOCKER_COMPOSE",
              module="github.com/docker/compose/v2", package="github.com/docker/compose/v2/cmd",
              version_variable="github.com/docker/compose/v2/internal.Version"),
)}

KUBE_COMMANDS = tuple(n for n, c in COMPONENTS.items() if c.kind == "kubernetes")
# What a local harness runs; the Trainer controller and Kueue are started only by the tests
# and tools that need them.
HARNESS_BINARIES = ("etcd", *KUBE_COMMANDS, "jobset-controller", "kwok")

# The kind node image's own binaries (clusters/kind_node.py): the node's Kubernetes commands,
# kind itself, the node's containerd and crictl, and the add-ons the node preloads. Added after
# KUBE_COMMANDS so the local harness neither needs nor builds them.
KIND_NODE_COMPONENTS = (
    _kube("kubelet"),
    _kube("kubeadm"),
    _kube("kube-proxy"),
    # v0.30.0 is the last kind that still tests cgroup v1 (DESIGN 3.2).
    Component("kind", "module", "v0.30.0", "TEST_ASSET_KIND",
              module="sigs.k8s.io/kind", package="sigs.k8s.io/kind"),
    # The node's container runtime, the release kind v0.30.0's images/base builds (Debian's
    # containerd 1.6 lacks the `ctr info` and `ctr images import --label` kind calls), with
    # kind's build tags; CGO is not needed with them.
    *(Component(name, "module", "v2.1.4", "TEST_ASSET_" + name.upper().replace("-", "_"),
                module="github.com/containerd/containerd/v2",
                package=f"github.com/containerd/containerd/v2/cmd/{name}",
                version_variable="github.com/containerd/containerd/v2/version.Version",
                extra_env={"GOFLAGS": "-mod=mod -tags=no_btrfs,no_devmapper,no_zfs"})
      for name in ("containerd", "ctr", "containerd-shim-runc-v2")),
    # The crictl release of the node's Kubernetes minor.
    Component("crictl", "module", "v1.34.0", "TEST_ASSET_CRICTL",
              module="sigs.k8s.io/cri-tools", package="sigs.k8s.io/cri-tools/cmd/crictl",
              version_variable="sigs.k8s.io/cri-tools/pkg/version.Version"),
    # The CoreDNS that kubeadm v1.34 deploys (its CoreDNSVersion constant).
    Component("coredns", "module", "v1.12.1", "TEST_ASSET_COREDNS",
              module="github.com/coredns/coredns", package="github.com/coredns/coredns"),
    # The release kind v0.30.0's images/local-path-provisioner builds.
    Component("local-path-provisioner", "module", "v0.0.30", "TEST_ASSET_LOCAL_PATH_PROVISIONER",
              module="github.com/rancher/local-path-provisioner",
              package="github.com/rancher/local-path-provisioner",
              version_variable="main.VERSION"),
)
COMPONENTS.update({c.name: c for c in KIND_NODE_COMPONENTS})
KIND_NODE_BINARIES = tuple(c.name for c in KIND_NODE_COMPONENTS)
ENV_OVERRIDES = {name: c.env_var for name, c in COMPONENTS.items()}
# Built only where the docker client lacks them (clusters/engine.py), not by a plain provision.
DOCKER_PLUGINS = ("docker-buildx", "docker-compose")
# What `python -m clusters provision` (and so `make binaries`) builds: the harness, Trainer,
# Kueue and controller-gen. The Docker plugins and the kind node's binaries are built by
# what needs them (the engine, `python -m clusters.kind_node`).
PROVISIONED = tuple(n for n in COMPONENTS if n not in DOCKER_PLUGINS + KIND_NODE_BINARIES)

Progress = Callable[[str], None]


def _log_progress(message: str) -> None:
    log.info("%s", message)


def stderr_progress(message: str) -> None:
    """Progress for a person watching a terminal."""
    print(message, file=sys.stderr, flush=True)


class ProvisioningError(RuntimeError):
    """A binary could neither be found nor built; the message says what to do."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the binaries found, by name; ``binaries.kube_apiserver`` reads
    ``paths["kube-apiserver"]``."""

    paths: dict[str, Path]

    def __getattr__(self, attribute: str) -> Path:
        name = attribute.replace("_", "-")
        try:
            return self.paths[name]
        except KeyError:
            raise AttributeError(f"no binary {name!r} was provisioned here") from None

    def as_dict(self) -> dict[str, str]:
        return {name: str(path) for name, path in self.paths.items()}


# The name the rest of the harness has always used.
ControlPlaneBinaries = Binaries


def cache_root() -> Path:
    if explicit := os.environ.get("CLUSTERS_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainjob-dispatcher"


def cached_path(binary: str) -> Path:
    component = COMPONENTS[binary]
    if component.kind == "kubernetes":
        return cache_root() / f"kubernetes-{KUBERNETES_VERSION}" / binary
    return cache_root() / f"{binary}-{component.version}" / binary


def _from_environment(binary: str) -> Path | None:
    variable = ENV_OVERRIDES[binary]
    if explicit := os.environ.get(variable):
        path = Path(explicit)
        if not _is_executable(path):
            raise ProvisioningError(f"{variable}={explicit}: not an executable file")
        return path
    if (assets := os.environ.get("KUBEBUILDER_ASSETS")) and COMPONENTS[binary].kind != "module":
        path = Path(assets) / binary
        # setup-envtest ships etcd, kube-apiserver and kubectl but not the controller-manager
        # or the scheduler; a missing one falls through to the cache or a build.
        if _is_executable(path):
            return path
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_binaries(build: bool = True, names: Iterable[str] = HARNESS_BINARIES,
                  progress: Progress = _log_progress) -> Binaries:
    """Return the binaries ``names``, building what is missing into the cache when ``build``."""
    names = list(names)
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise ProvisioningError(f"unknown binary {', '.join(unknown)}; "
                                f"known: {', '.join(COMPONENTS)}")
    found: dict[str, Path] = {}
    # A broken explicit override is reported before anything is looked up or built.
    overrides = {name: _from_environment(name) for name in names}
    missing: list[str] = []
    for name, path in overrides.items():
        if path is None and _is_executable(cached_path(name)):
            path = cached_path(name)
        if path is None:
            if not build:
                raise ProvisioningError(
                    f"{name} not found: set {ENV_OVERRIDES[name]}"
                    + (" or KUBEBUILDER_ASSETS" if COMPONENTS[name].kind != "module" else "")
                    + ", or run `python -m clusters provision` to build it into "
                    + f"{cached_path(name)}"
                )
            missing.append(name)
            continue
        found[name] = path
    kube = [n for n in missing if COMPONENTS[n].kind == "kubernetes"]
    if kube:
        found.update(build_kubernetes(kube, progress))
    for name in missing:
        if COMPONENTS[name].kind == "etcd":
            found[name] = build_etcd(progress)
        elif COMPONENTS[name].kind == "module":
            found[name] = build_module(COMPONENTS[name], progress)
    return Binaries({name: found[name] for name in names})


def binary_version(path: Path, name: str | None = None) -> str:
    """The version a binary reports: ``--version`` for the control plane, the module version
    recorded in the binary's build information for the upstream controllers."""
    name = name or path.name
    component = COMPONENTS.get(name)
    if component is not None and component.kind == "module":
        return _module_version_in(path, component.module)
    # kubectl has no --version flag; its client version is a subcommand.
    args = ["version", "--client"] if name == "kubectl" else ["--version"]
    out = subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=30, check=False
    )
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _module_version_in(path: Path, module: str) -> str:
    go = shutil.which("go")
    if go is None:
        return "unknown (Go is needed to read the build information)"
    out = subprocess.run([go, "version", "-m", str(path)], capture_output=True, text=True,
                         timeout=30, check=False)
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] in ("dep", "mod") and fields[1] == module:
            return f"{module} {fields[2]}"
    return "unknown"


@functools.cache
@functools.cache  # `go mod download` answers in seconds even when the module is cached
def module_dir(name: str) -> Path:
    """The source of an upstream component's module in the Go module cache (downloaded if
    missing), where its CRDs and configuration files are read from."""
    component = COMPONENTS[name]
    if component.kind != "module":
        raise ValueError(f"{name} is not built from a published module")
    # A copy of the module's files where no Go module cache is (docker-compose's set-up reads
    # JobSet's CRD from the JobSet image): TEST_ASSET_JOBSET_MODULE_DIR and the like.
    if explicit := os.environ.get(f"{component.env_var}_MODULE_DIR"):
        return Path(explicit)
    return _download(component, component.module, component.version)


@functools.cache
def dependency_dir(name: str, module: str) -> Path:
    """The source of ``module`` at the version component ``name``'s go.mod requires (e.g.
    the scheduler-plugins API the Trainer controller is built against), downloaded if
    missing."""
    return _download(COMPONENTS[name], module, dependency_version(name, module))


def dependency_version(name: str, module: str) -> str:
    """The version of ``module`` that component ``name``'s go.mod requires."""
    go_mod = (module_dir(name) / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(\S+)", go_mod, re.MULTILINE)
    if found is None:
        raise ProvisioningError(f"{COMPONENTS[name].source} does not require {module}")
    return found.group(1)


def generated_crds(name: str, module: str, package: str,
                   progress: Progress = _log_progress) -> Path:
    """The CRDs controller-gen makes from the API types in ``package`` of ``module``, at the
    version component ``name`` is built against: a directory of YAML files in the cache,
    made once. For APIs whose project publishes its CRDs only in a repository the module
    proxy does not serve (Volcano's), this is the same generation the project runs."""
    version = dependency_version(name, module)
    target = cache_root() / f"crds-{module.replace('/', '_')}-{version}"
    with _build_lock(target.name):
        if not target.is_dir():
            generator = find_binaries(names=["controller-gen"], progress=progress).controller_gen
            started = time.monotonic()
            source = f"{package} {version}"
            progress(f"generating CRDs of {source}")
            with tempfile.TemporaryDirectory(prefix="crds-", dir=cache_root()) as tmp:
                workdir = Path(tmp)
                (workdir / "go.mod").write_text(
                    f"module trainjob.local/crds\n\ngo {GO_DIRECTIVE}\n")
                _run_go(["get", f"{package}@{version}"], workdir, what="CRDs", source=source,
                        progress=progress, started=started)
                out = workdir / "out"
                proc = subprocess.run([str(generator), "crd", f"paths={package}",
                                       f"output:crd:dir={out}"], cwd=workdir,
                                      env=_go_env(), capture_output=True, text=True,
                                      check=False, timeout=600)
                if proc.returncode != 0 or not out.is_dir():
                    raise ProvisioningError(
                        f"controller-gen could not generate the CRDs of {source}: "
                        f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
                os.replace(out, target)
            progress(f"generated CRDs of {source} in {_elapsed(time.monotonic() - started)}")
    return target


def _download(component: Component, module: str, version: str) -> Path:
    proc = subprocess.run(
        [_go(), "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True, text=True, check=False, env=_go_env(component.extra_env),
        cwd=tempfile.gettempdir(),
    )
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        detail = info.get("Error") or (proc.stderr or proc.stdout).strip()[-500:]
        raise ProvisioningError(
            f"cannot download {module}@{version} into the Go module cache: {detail}\n"
            f"retry with: go mod download {module}@{version}"
        )
    return Path(info["Dir"])


# --- building -------------------------------------------------------------------------


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ProvisioningError(
            "Go is needed to build the harness binaries and is not on PATH. Install Go "
            f">= {GO_DIRECTIVE[:4]}, or point KUBEBUILDER_ASSETS / TEST_ASSET_* at existing "
            "binaries."
        )
    return go


def _go_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    # A user's GOFLAGS such as -mod=vendor would break the scratch module.
    env["GOFLAGS"] = "-mod=mod"
    env.update(extra_env or {})
    return env


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def _run_go(args: list[str], workdir: Path, *, what: str, source: str, progress: Progress,
            extra_env: dict[str, str] | None = None, started: float | None = None) -> None:
    """Run one go step; print a line every 30 s while it runs, since a cold build takes
    minutes. A failure names the binary, the module and version, the step and how to retry."""
    started = time.monotonic() if started is None else started
    step = f"go {args[0]}"
    progress(f"  {what}: {step} ... ({_elapsed(time.monotonic() - started)})")
    log.debug("running go %s in %s", " ".join(args), workdir)
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen([_go(), *args], cwd=workdir, env=_go_env(extra_env),
                                stdout=output, stderr=subprocess.STDOUT, text=True)
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                progress(f"  {what}: still in {step} ({_elapsed(time.monotonic() - started)})")
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if proc.returncode != 0:
            output.seek(0)
            tail = "\n".join(output.read().strip().splitlines()[-25:])
            raise ProvisioningError(
                f"building {what} from {source} failed at step `{step}` "
                f"(`go {' '.join(args)}` in {workdir}, exit {proc.returncode}):\n{tail}\n"
                f"retry with: python -m clusters provision --only {what}"
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
    build_date = format_time()
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


def build_kubernetes(commands: Iterable[str] = KUBE_COMMANDS,
                     progress: Progress = _log_progress) -> dict[str, Path]:
    """Build the given k8s.io/kubernetes commands into the cache; return their paths."""
    commands = list(commands)
    staging_version = "v0" + KUBERNETES_VERSION[2:]
    with _build_lock(f"kubernetes-{KUBERNETES_VERSION}"):
        wanted = [c for c in commands if not _is_executable(cached_path(c))]
        if wanted:
            what = ",".join(wanted)
            source = f"k8s.io/kubernetes {KUBERNETES_VERSION}"
            started = time.monotonic()
            progress(f"building {what} ({source})")
            target_dir = cached_path(commands[0]).parent
            target_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="build-", dir=cache_root()) as tmp:
                workdir = Path(tmp)
                _scratch_module(
                    workdir,
                    "trainjob.local/controlplane",
                    source,
                    [f"k8s.io/{m} => k8s.io/{m} {staging_version}" for m in STAGING_MODULES],
                    [f"k8s.io/kubernetes/cmd/{c}" for c in wanted],
                )
                steps = dict(what=what, source=source, progress=progress, started=started)
                _run_go(["mod", "tidy"], workdir, **steps)
                out = workdir / "out"
                out.mkdir()
                _run_go(
                    ["build", "-trimpath", "-ldflags", _version_ldflags(KUBERNETES_VERSION),
                     "-o", str(out) + "/", *[f"k8s.io/kubernetes/cmd/{c}" for c in wanted]],
                    workdir, **steps,
                )
                for command in wanted:
                    # rename is atomic: a reader never sees a half-written binary.
                    os.replace(out / command, cached_path(command))
            progress(f"built {what} in {_elapsed(time.monotonic() - started)}")
    return {c: cached_path(c) for c in commands}


def build_etcd(progress: Progress = _log_progress) -> Path:
    """Build etcd into the cache; return its path."""
    target = cached_path("etcd")
    with _build_lock(f"etcd-{ETCD_VERSION}"):
        if not _is_executable(target):
            source = COMPONENTS["etcd"].source
            started = time.monotonic()
            progress(f"building etcd ({source})")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="build-", dir=cache_root()) as tmp:
                workdir = Path(tmp)
                _scratch_module(
                    workdir, "trainjob.local/etcd",
                    source, [], ["go.etcd.io/etcd/server/v3"],
                )
                steps = dict(what="etcd", source=source, progress=progress, started=started)
                _run_go(["mod", "tidy"], workdir, **steps)
                _run_go(
                    ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(workdir / "etcd"),
                     "go.etcd.io/etcd/server/v3"],
                    workdir, **steps,
                )
                os.replace(workdir / "etcd", target)
            progress(f"built etcd in {_elapsed(time.monotonic() - started)}")
    return target


def build_module(component: Component, progress: Progress = _log_progress) -> Path:
    """Build an upstream controller from its published module: `go get` + `go build` in a
    scratch module of its own, no replace directives."""
    target = cached_path(component.name)
    with _build_lock(f"{component.name}-{component.version}"):
        if not _is_executable(target):
            started = time.monotonic()
            progress(f"building {component.name} ({component.source})")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="build-", dir=cache_root()) as tmp:
                workdir = Path(tmp)
                (workdir / "go.mod").write_text(
                    f"module trainjob.local/{component.name}\n\ngo {GO_DIRECTIVE}\n")
                steps = dict(what=component.name, source=component.source, progress=progress,
                             started=started, extra_env=component.extra_env)
                _run_go(["get", f"{component.package}@{component.version}"], workdir, **steps)
                ldflags = "-s -w"
                if component.version_variable:
                    ldflags += f" -X {component.version_variable}={component.version}"
                _run_go(["build", "-trimpath", "-ldflags", ldflags,
                         "-o", str(workdir / component.name), component.package],
                        workdir, **steps)
                os.replace(workdir / component.name, target)
            progress(f"built {component.name} in {_elapsed(time.monotonic() - started)}")
    return target
