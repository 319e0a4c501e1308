"""Every container image the project runs, built on this machine from sources: Debian's
packages, Go modules and PyPI. Nothing is pulled unless asked (``--pull``), so the images
build where no registry can be reached; each is tagged with the name its upstream image has,
so docker-compose.yml and the manifests name them as they would anywhere.

  debian:bookworm-slim          debootstrap --variant=minbase, trimmed, `docker import`
  python:3.11-slim-bookworm     Debian's python3 on it (images/python-base.Dockerfile)
  trainjob-dispatcher, training-operator   images/Dockerfile, pip given the CA bundle as a
                                build secret (never written into a layer)
  registry.k8s.io/etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
  registry.k8s.io/jobset/jobset, registry.k8s.io/kwok/kwok, registry.k8s.io/kueue/kueue
                                the harness's own static binaries (images/binary.Dockerfile)
  trainjob-workload             a container that runs for a given time and exits with a
                                given code (images/workload)
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from clusters import binaries
from clusters.engine import Engine, EngineError, ensure_cli_plugins, install_debian_packages

Progress = Callable[[str], None]

PROJECT_VERSION = importlib.metadata.version("trainjob-dispatcher")
DEBIAN_IMAGE = "debian:bookworm-slim"
PYTHON_IMAGE = "python:3.11-slim-bookworm"
DISPATCHER_IMAGE = f"trainjob-dispatcher:{PROJECT_VERSION}"
OPERATOR_IMAGE = f"training-operator:{PROJECT_VERSION}"
WORKLOAD_IMAGE = f"trainjob-workload:{PROJECT_VERSION}"
DEBIAN_SUITE = "bookworm"
# Where pip finds the CA bundle to trust; the first that exists is given as a build secret.
# On every image built here: a rebuild leaves the image it replaced untagged ("dangling"),
# and only those carrying this label are pruned, never an engine user's own.
BUILT_BY_LABEL = "org.trainjob.built-by=trainjob-dispatcher"
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
# Left out of the Debian base, as the official slim image leaves them out.
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*",
                 "/usr/share/info/*", "/usr/share/lintian/*")


@dataclasses.dataclass(frozen=True)
class BinaryImage:
    """An image holding one binary the harness provisions, where its upstream image keeps it."""

    binary: str
    repository: str
    tag: str
    target: str
    # Upstream files the container needs at start, copied from the module cache into the
    # image (relative to the module's root).
    module_files: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.repository}:{self.tag}"


def _kube_image(binary: str) -> BinaryImage:
    return BinaryImage(binary, f"registry.k8s.io/{binary}", binaries.KUBERNETES_VERSION,
                       f"/usr/local/bin/{binary}")


BINARY_IMAGES: dict[str, BinaryImage] = {i.binary: i for i in (
    # registry.k8s.io tags etcd without the "v" and with a build suffix.
    BinaryImage("etcd", "registry.k8s.io/etcd", binaries.ETCD_VERSION[1:] + "-0",
                "/usr/local/bin/etcd"),
    _kube_image("kube-apiserver"),
    _kube_image("kube-controller-manager"),
    _kube_image("kube-scheduler"),
    BinaryImage("jobset-controller", "registry.k8s.io/jobset/jobset",
                binaries.COMPONENTS["jobset-controller"].version, "/manager",
                module_files=("config/components",)),
    BinaryImage("kwok", "registry.k8s.io/kwok/kwok", binaries.COMPONENTS["kwok"].version,
                "/usr/local/bin/kwok", module_files=("kustomize/stage",)),
    # Where Kueue's release runs it (`command: [/manager]`), by the name its manifests give.
    BinaryImage("kueue", "registry.k8s.io/kueue/kueue", binaries.COMPONENTS["kueue"].version,
                "/manager"),
)}

# Every image by the name `--only` takes.
IMAGE_NAMES = ("debian", "python", "dispatcher", "training-operator", *BINARY_IMAGES,
               "workload")


def images_dir() -> Path:
    """The project's Dockerfiles (the repository's images/ folder)."""
    return project_root() / "images"


def project_root() -> Path:
    root = Path(__file__).resolve().parent.parent
    if not (root / "images" / "Dockerfile").is_file():
        raise EngineError(f"images/Dockerfile not found under {root}: run from a checkout "
                          "of the project")
    return root


def image_exists(engine: Engine, name: str) -> bool:
    return engine.docker("image", "inspect", name, check=False).returncode == 0


def image_size(engine: Engine, name: str) -> int:
    result = engine.docker("image", "inspect", "--format", "{{.Size}}", name)
    return int(result.stdout.strip())


def ca_bundle() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      *CA_BUNDLES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _build(engine: Engine, tag: str, context: Path, dockerfile: Path,
           build_args: dict[str, str] | None = None, target: str | None = None,
           secrets: dict[str, Path] | None = None) -> None:
    argv = ["build", "--progress=plain", "-t", tag, "-f", str(dockerfile),
            "--label", BUILT_BY_LABEL]
    for key, value in (build_args or {}).items():
        argv += ["--build-arg", f"{key}={value}"]
    for key, path in (secrets or {}).items():
        argv += ["--secret", f"id={key},src={path}"]
    if target:
        argv += ["--target", target]
    env = {**engine.env(), "DOCKER_BUILDKIT": "1"}
    result = subprocess.run(["docker", *argv, str(context)], env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise EngineError(f"building {tag} failed (`docker {' '.join(argv)} {context}`):\n"
                          + "\n".join(result.stderr.strip().splitlines()[-30:]))


def _pull(engine: Engine, name: str, progress: Progress) -> bool:
    try:
        result = engine.docker("pull", "--quiet", name, check=False, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    if result.returncode == 0:
        progress(f"  pulled {name}")
    return result.returncode == 0


def build_debian_base(engine: Engine, progress: Progress) -> None:
    """debian:bookworm-slim from Debian's packages: debootstrap, trimmed as the official
    slim image is, imported as a single layer."""
    if shutil.which("debootstrap") is None:
        install_debian_packages(("debootstrap",), "debootstrap is needed to build the Debian "
                                "base image (apt-get install debootstrap), or pull "
                                "debian:bookworm-slim with --pull where a registry is "
                                "reachable", progress)
    debootstrap = shutil.which("debootstrap")
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=binaries.cache_root()) as tmp:
        root = Path(tmp) / "rootfs"
        result = subprocess.run([debootstrap, "--variant=minbase", DEBIAN_SUITE, str(root)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise EngineError("debootstrap failed:\n"
                              + "\n".join(result.stdout.strip().splitlines()[-20:]))
        dpkg_config = root / "etc/dpkg/dpkg.cfg.d/slim"
        dpkg_config.write_text("".join(f"path-exclude {p}\n" for p in SLIM_EXCLUDES)
                               + "path-include /usr/share/doc/*/copyright\n")
        for pattern in (*SLIM_EXCLUDES, "/var/cache/apt/archives/*.deb", "/var/cache/apt/*.bin",
                        "/var/lib/apt/lists/*", "/var/log/*.log"):
            parent, _, glob = pattern.lstrip("/").rpartition("/")
            for path in (root / parent).glob(glob):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "--change", 'CMD ["bash"]', "-",
                                   DEBIAN_IMAGE], stdin=tar.stdout, env=engine.env(),
                                  capture_output=True, text=True)
        tar.stdout.close()
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise EngineError(f"docker import of the Debian root file system failed: "
                              f"{imported.stderr.strip()}")


def build_binary_image(engine: Engine, image: BinaryImage, progress: Progress) -> None:
    """An image of one harness binary (built from its module first if it is not cached)."""
    path = binaries.find_binaries(names=[image.binary], progress=progress).paths[image.binary]
    with tempfile.TemporaryDirectory(prefix="image-", dir=binaries.cache_root()) as tmp:
        context = Path(tmp)
        shutil.copy2(path, context / image.binary)
        config = context / "config"
        config.mkdir()
        if image.module_files:
            module = binaries.module_dir(image.binary)
            for relative in image.module_files:
                shutil.copytree(module / relative, config / relative)
            for file in config.rglob("*"):
                # The module cache is read-only; the copies need not be.
                file.chmod(0o755 if file.is_dir() else 0o644)
        _build(engine, image.name, context, images_dir() / "binary.Dockerfile",
               build_args={"BINARY": image.binary, "TARGET": image.target})


def build_workload_image(engine: Engine, progress: Progress) -> None:
    source = images_dir() / "workload"
    with tempfile.TemporaryDirectory(prefix="image-", dir=binaries.cache_root()) as tmp:
        context = Path(tmp)
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
        result = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o",
                                 str(context / "workload"), "."], cwd=source, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise EngineError(f"building the workload program failed: {result.stderr.strip()}")
        _build(engine, WORKLOAD_IMAGE, context, source / "Dockerfile")


def build_project_image(engine: Engine, target: str, tag: str) -> None:
    bundle = ca_bundle()
    _build(engine, tag, project_root(), images_dir() / "Dockerfile",
           build_args={"PYTHON_IMAGE": PYTHON_IMAGE}, target=target,
           secrets={"ca": bundle} if bundle else None)


def build_images(engine: Engine, only: tuple[str, ...] = (), pull: bool = False,
                 rebuild: bool = False,
                 progress: Progress = binaries.stderr_progress) -> dict[str, str]:
    """Build (or, with ``pull``, first try to pull) every image in ``only`` (default: all);
    return image name -> what was done. The bases and binary images are kept when present
    (``rebuild`` replaces them); the project's images are always rebuilt from the
    working tree (BuildKit's cache makes an unchanged rebuild take seconds)."""
    wanted = only or IMAGE_NAMES
    unknown = [n for n in wanted if n not in IMAGE_NAMES]
    if unknown:
        raise EngineError(f"unknown image {', '.join(unknown)}; known: {', '.join(IMAGE_NAMES)}")
    ensure_cli_plugins(engine, progress)
    done: dict[str, str] = {}

    def step(name: str, image: str, build: Callable[[], None], keep: bool = True) -> None:
        # ``keep`` marks the upstream images; the project's own are never pulled.
        if keep and not rebuild and image_exists(engine, image):
            done[image] = "present"
            return
        if keep and pull and _pull(engine, image, progress):
            done[image] = "pulled"
            return
        started = time.monotonic()
        progress(f"building image {image}")
        build()
        seconds = time.monotonic() - started
        done[image] = f"built in {seconds:.0f} s, {image_size(engine, image) / 1e6:.0f} MB"
        progress(f"  {image}: {done[image]}")

    needs_python = {"python", "dispatcher", "training-operator"} & set(wanted)
    if "debian" in wanted or needs_python:
        step("debian", DEBIAN_IMAGE, lambda: build_debian_base(engine, progress))
    if needs_python:
        step("python", PYTHON_IMAGE, lambda: _build(
            engine, PYTHON_IMAGE, images_dir(), images_dir() / "python-base.Dockerfile"))
    for target, tag in (("dispatcher", DISPATCHER_IMAGE), ("training-operator", OPERATOR_IMAGE)):
        if target in wanted:
            step(target, tag, lambda target=target, tag=tag: build_project_image(
                engine, target, tag), keep=False)
    for name, image in BINARY_IMAGES.items():
        if name in wanted:
            step(name, image.name, lambda image=image: build_binary_image(
                engine, image, progress))
    if "workload" in wanted:
        step("workload", WORKLOAD_IMAGE, lambda: build_workload_image(engine, progress),
             keep=False)
    engine.docker("image", "prune", "--force", "--filter", f"label={BUILT_BY_LABEL}",
                  check=False)
    return done
