"""A kind node image for the harness's Kubernetes (``kindest/node:v1.34.4``), built entirely on
this machine: no registry is reached and nothing is downloaded but Go modules and Debian's
packages. ``python -m clusters.kind_node`` runs the four steps; each keeps what it finds.

  1. ``trainjob/kind-base:<kind version>``: kind's base image from Debian's systemd, runc and
     CNI plugins plus containerd and crictl from their modules (images/kind-base.Dockerfile;
     kind's own files are read from the kind module in the Go module cache).
  2. the images the node preloads that the harness does not build already: pause, CoreDNS,
     kube-proxy, kindnetd, local-path-provisioner and its helper (images/kind/addons.Dockerfile),
     each tagged with the name kubeadm or kind asks for. The control plane's images
     (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) are clusters/images.py's.
  3. a Kubernetes server tarball as ``kind build node-image --type file`` reads it:
     ``kubernetes/version``, ``kubernetes/server/bin/<commands>`` and, for the four images kind
     loads from there, ``<name>.tar`` (``docker save``) and ``<name>.docker_tag``.
  4. ``kind build node-image --type file TARBALL --base-image BASE --image kindest/node:...``.

kind pulls, from inside its build container, every image kubeadm lists and every add-on image
that is not in the tarball's archives; it recognises an archive's images by the first
metadata file it meets, ``manifest.json`` (first image only) or ``repositories`` (all). So
kube-proxy.tar carries the add-on images too, with ``repositories`` written first: kind then
pulls nothing and loads them all with ``ctr images import``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from clusters import binaries, images
from clusters.engine import Engine, EngineError, ensure_engine

Progress = Callable[[str], None]

KIND_VERSION = binaries.COMPONENTS["kind"].version
KUBERNETES_VERSION = binaries.KUBERNETES_VERSION
BASE_IMAGE = f"trainjob/kind-base:{KIND_VERSION}"
NODE_IMAGE = f"kindest/node:{KUBERNETES_VERSION}"
# The base image's binaries built from Go modules (images/kind-base.Dockerfile).
BASE_BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2", "crictl")
# The server tarball's commands: what kind installs (kubeadm, kubelet, kubectl) and the rest
# of a release's server/bin.
SERVER_COMMANDS = ("kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager",
                   "kube-scheduler", "kube-proxy")
# The image archives kind v0.30.0 reads from server/bin (pkg/build/nodeimage/internal/kube).
ARCHIVED_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
# Targets of images/kind/addons.Dockerfile, and the binary each one copies in.
ADDON_BINARIES = {"pause": "pause", "coredns": "coredns", "kube-proxy": "kube-proxy",
                  "kindnetd": "kindnetd", "local-path-provisioner": "local-path-provisioner",
                  "local-path-helper": None}
# The small programs of images/kind that are built with `go build` in place.
LOCAL_PROGRAMS = ("pause", "kindnetd")
# The label that records what an image was built from (a digest of its Dockerfile, the files
# copied in and the versions of the binaries), so a change rebuilds it.
INPUTS_LABEL = "org.trainjob.inputs"


class KindNodeError(RuntimeError):
    """A step of the node image build failed; the message says which and why."""


def kind_dir() -> Path:
    """images/kind: the add-on Dockerfile, pause, kindnetd and the iptables wrapper."""
    return images.images_dir() / "kind"


def work_dir() -> Path:
    """Where the server tarball is kept, beside the binaries it is made of."""
    return binaries.cache_root() / f"kind-node-{KUBERNETES_VERSION}"


def _elapsed(started: float) -> str:
    return binaries._elapsed(time.monotonic() - started)


def _size(engine: Engine, image: str) -> str:
    return f"{images.image_size(engine, image) / 1e6:.0f} MB"


def _image_id(engine: Engine, image: str) -> str:
    return engine.docker("image", "inspect", "--format", "{{.Id}}", image).stdout.decode().strip()


def _label(engine: Engine, image: str) -> str | None:
    """The inputs digest an image was built with (its INPUTS_LABEL), None if it is absent."""
    result = engine.docker("image", "inspect", "--format",
                           f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', image, check=False)
    return result.stdout.decode().strip() if result.returncode == 0 else None


def _digest(*parts: str | Path) -> str:
    """A digest of file contents (for paths: every file under them) and strings."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            for path in sorted([part] if part.is_file() else part.rglob("*")):
                if path.is_file():
                    digest.update(str(path.relative_to(part.parent)).encode() + b"\0")
                    digest.update(path.read_bytes() + b"\0")
        else:
            digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


# --- names: what kubeadm and kind will ask the node for --------------------------------


def kind_addon_images() -> dict[str, str]:
    """The add-on images kind v0.30.0's node image build preloads, read from kind's source
    (pkg/build/nodeimage/const_*.go): kindnetd, local-path-provisioner and its helper."""
    source = binaries.module_dir("kind") / "pkg" / "build" / "nodeimage"
    text = "".join(p.read_text() for p in sorted(source.glob("const_*.go")))
    found = {}
    for target, constant in (("kindnetd", "kindnetdImage"),
                             ("local-path-provisioner", "storageProvisionerImage"),
                             ("local-path-helper", "storageHelperImage")):
        match = re.search(rf'^const {constant} = "([^"]+)"', text, re.MULTILINE)
        if match is None:
            raise KindNodeError(f"{constant} not found in {source}: kind's layout changed")
        found[target] = match.group(1)
    return found


def kubeadm_images(kubeadm: Path) -> dict[str, str]:
    """The images kubeadm wants for KUBERNETES_VERSION, by short name (kube-apiserver,
    coredns, pause, etcd, ...), from ``kubeadm config images list``."""
    out = subprocess.run([str(kubeadm), "config", "images", "list", "--kubernetes-version",
                          KUBERNETES_VERSION], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise KindNodeError(f"kubeadm config images list failed: {out.stderr.strip()}")
    listed = {}
    for line in out.stdout.split():
        repository = line.rsplit(":", 1)[0]
        listed[repository.rsplit("/", 1)[-1]] = line
    return listed


def preloaded_images(kubeadm: Path) -> dict[str, str]:
    """Every image the node preloads, by short name -> the exact name kind looks for."""
    return {**kubeadm_images(kubeadm), **kind_addon_images()}


# --- step 1: base image -----------------------------------------------------------------


def build_base_image(engine: Engine, progress: Progress = binaries.stderr_progress,
                     rebuild: bool = False) -> str:
    """trainjob/kind-base:<kind version> from images/kind-base.Dockerfile; kept while its
    inputs are unchanged."""
    kind_files = binaries.module_dir("kind") / "images" / "base" / "files"
    runtime = Path(__file__).with_name("oci_runtime.py")
    # kind preloads the sandbox image the base's containerd names: kubeadm's pause.
    kubeadm = binaries.find_binaries(names=["kubeadm"], progress=progress).kubeadm
    pause = kubeadm_images(kubeadm)["pause"]
    inputs = _digest(images.images_dir() / "kind-base.Dockerfile", kind_files, runtime, pause,
                     *(binaries.COMPONENTS[n].source for n in BASE_BINARIES))
    if not rebuild and _label(engine, BASE_IMAGE) == inputs:
        progress(f"{BASE_IMAGE}: present")
        return BASE_IMAGE
    started = time.monotonic()
    images.build_images(engine, only=("debian",), progress=progress)
    found = binaries.find_binaries(names=BASE_BINARIES, progress=progress).paths
    progress(f"building image {BASE_IMAGE}")
    with tempfile.TemporaryDirectory(prefix="kind-base-", dir=binaries.cache_root()) as tmp:
        context = Path(tmp)
        _copy_tree(kind_files, context / "files")
        for name, path in found.items():
            shutil.copy2(path, context / name)
        shutil.copy2(runtime, context / "oci-runtime")
        images._build(engine, BASE_IMAGE, context, images.images_dir() / "kind-base.Dockerfile",
                      build_args={"BASE_IMAGE": images.DEBIAN_IMAGE, "PAUSE_IMAGE": pause,
                                  "INPUTS": inputs})
    progress(f"  {BASE_IMAGE}: built in {_elapsed(started)}, {_size(engine, BASE_IMAGE)}")
    return BASE_IMAGE


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target)
    # The module cache is read-only; the copies must be removable.
    for path in (target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else (path.stat().st_mode | 0o644) & 0o755)


# --- step 2: add-on images --------------------------------------------------------------


def _build_local_program(name: str, target: Path) -> None:
    source = kind_dir() / name
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(target),
                             "."], cwd=source, env=env, capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise KindNodeError(f"building {source} failed: {result.stderr.strip()[-1500:]}")


def build_addon_images(engine: Engine, progress: Progress = binaries.stderr_progress,
                       rebuild: bool = False) -> dict[str, str]:
    """The node's add-on images (images/kind/addons.Dockerfile), tagged as kubeadm and kind
    name them; return target -> image. Images present are kept."""
    kubeadm = binaries.find_binaries(names=["kubeadm"], progress=progress).kubeadm
    names = preloaded_images(kubeadm)
    wanted = {target: names[target] for target in ADDON_BINARIES}
    inputs = _digest(kind_dir(), *(binaries.COMPONENTS[b].source for b in ADDON_BINARIES.values()
                                   if b and b not in LOCAL_PROGRAMS))
    missing = [t for t, image in wanted.items() if rebuild or _label(engine, image) != inputs]
    for target in wanted:
        if target not in missing:
            progress(f"{wanted[target]}: present")
    if not missing:
        return wanted
    images.build_images(engine, only=("debian",), progress=progress)
    module_binaries = [ADDON_BINARIES[t] for t in missing
                       if ADDON_BINARIES[t] and ADDON_BINARIES[t] not in LOCAL_PROGRAMS]
    found = binaries.find_binaries(names=module_binaries, progress=progress).paths
    with tempfile.TemporaryDirectory(prefix="kind-addons-", dir=binaries.cache_root()) as tmp:
        context = Path(tmp)
        for name, path in found.items():
            shutil.copy2(path, context / name)
        for name in LOCAL_PROGRAMS:
            if name in missing:
                _build_local_program(name, context / name)
        shutil.copy2(kind_dir() / "iptables-wrapper", context / "iptables-wrapper")
        for target in missing:
            started = time.monotonic()
            progress(f"building image {wanted[target]}")
            images._build(engine, wanted[target], context, kind_dir() / "addons.Dockerfile",
                          build_args={"DEBIAN_IMAGE": images.DEBIAN_IMAGE, "INPUTS": inputs},
                          target=target)
            progress(f"  {wanted[target]}: built in {_elapsed(started)}, "
                     f"{_size(engine, wanted[target])}")
    return wanted


# --- step 3: the server tarball ---------------------------------------------------------


def _docker_name(name: str) -> str:
    """The name as kind compares it: Docker drops the docker.io/ prefix that kind keeps."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return "docker.io/" + (name if "/" in name else "library/" + name)


def save_archive(engine: Engine, names: list[str], target: Path) -> None:
    """``docker save`` of ``names`` into one archive at ``target``, rewritten so that kind
    sees every image: fully qualified names, and ``repositories`` (which lists them all)
    ahead of ``manifest.json`` (of which kind reads only the first entry)."""
    with tempfile.TemporaryDirectory(prefix="save-", dir=target.parent) as tmp:
        saved = Path(tmp) / "saved.tar"
        engine.docker("save", "-o", str(saved), *names, timeout=600)
        with tarfile.open(saved) as source:
            manifest = json.load(source.extractfile("manifest.json"))
            repositories = {}
            for entry in manifest:
                entry["RepoTags"] = [_docker_name(t) for t in entry.get("RepoTags") or []]
                top_layer = entry["Layers"][-1].split("/")[0]
                for tag in entry["RepoTags"]:
                    repository, _, version = tag.rpartition(":")
                    repositories.setdefault(repository, {})[version] = top_layer
            # The first name asked for leads manifest.json, as a single-image archive would.
            manifest.sort(key=lambda e: _docker_name(names[0]) not in e["RepoTags"])
            partial = target.with_suffix(".partial")
            with tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as archive:
                for name, document in (("repositories", repositories),
                                       ("manifest.json", manifest)):
                    data = json.dumps(document).encode()
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    archive.addfile(info, io.BytesIO(data))
                for member in source:
                    if member.name in ("repositories", "manifest.json"):
                        continue
                    archive.addfile(member, source.extractfile(member) if member.isfile()
                                    else None)
            os.replace(partial, target)


def _tarball_inputs(engine: Engine, archives: dict[str, list[str]],
                    commands: dict[str, Path]) -> str:
    """What the tarball is made of (image IDs, binaries' sizes and times), so a changed
    input makes a new tarball."""
    ids = {}
    for names in archives.values():
        for name in names:
            ids[name] = engine.docker("image", "inspect", "--format", "{{.Id}}",
                                      name).stdout.decode().strip()
    stats = {n: [p.stat().st_size, p.stat().st_mtime_ns] for n, p in commands.items()}
    document = json.dumps({"images": ids, "commands": stats, "layout": 1}, sort_keys=True)
    return hashlib.sha256(document.encode()).hexdigest()


def build_server_tarball(engine: Engine, progress: Progress = binaries.stderr_progress,
                         rebuild: bool = False) -> Path:
    """kubernetes-server-linux-amd64.tar.gz in the cache, as ``kind build node-image --type
    file`` reads it; rebuilt when an input changed."""
    commands = binaries.find_binaries(names=SERVER_COMMANDS, progress=progress).paths
    images.build_images(engine, only=("etcd", "kube-apiserver", "kube-controller-manager",
                                      "kube-scheduler"), progress=progress)
    build_addon_images(engine, progress, rebuild)
    names = preloaded_images(commands["kubeadm"])
    for short, image in names.items():
        if not images.image_exists(engine, image):
            # The harness's etcd image is tagged from ETCD_VERSION; kubeadm may name another.
            if short == "etcd":
                engine.docker("tag", images.BINARY_IMAGES["etcd"].name, image)
            else:
                raise KindNodeError(f"{image} (wanted by kubeadm or kind) was not built")
    # The first three archives hold their own image; kube-proxy's also every other one.
    archives = {c: [names[c]] for c in ARCHIVED_COMMANDS}
    archives["kube-proxy"] += [image for short, image in names.items()
                               if short not in ARCHIVED_COMMANDS]
    target = work_dir() / "kubernetes-server-linux-amd64.tar.gz"
    stamp = target.with_name(target.name + ".inputs")
    inputs = _tarball_inputs(engine, archives, commands)
    if (not rebuild and target.is_file() and stamp.is_file()
            and stamp.read_text().strip() == inputs):
        progress(f"{target}: present")
        return target
    started = time.monotonic()
    progress(f"assembling {target.name}")
    work_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tarball-", dir=work_dir()) as tmp:
        root = Path(tmp) / "kubernetes"
        bin_dir = root / "server" / "bin"
        bin_dir.mkdir(parents=True)
        (root / "version").write_text(KUBERNETES_VERSION + "\n")
        for name, path in commands.items():
            shutil.copy2(path, bin_dir / name)
        for command, archive_names in archives.items():
            progress(f"  docker save {' '.join(archive_names)}")
            save_archive(engine, archive_names, bin_dir / f"{command}.tar")
            (bin_dir / f"{command}.docker_tag").write_text(KUBERNETES_VERSION + "\n")
        partial = target.with_suffix(".partial")
        progress(f"  compressing ({_elapsed(started)})")
        with open(partial, "wb") as out:
            tar = subprocess.Popen(["tar", "-C", str(root.parent), "-c", "kubernetes"],
                                   stdout=subprocess.PIPE)
            # Level 1: kind unpacks it once, right away; speed beats size here.
            with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as zipped:
                shutil.copyfileobj(tar.stdout, zipped, 1 << 20)
            if tar.wait() != 0:
                raise KindNodeError(f"tar of {root} failed")
        os.replace(partial, target)
    stamp.write_text(inputs + "\n")
    progress(f"  {target.name}: built in {_elapsed(started)}, "
             f"{target.stat().st_size / 1e6:.0f} MB")
    return target


# --- step 4: the node image -------------------------------------------------------------


def build_node_image(engine: Engine, progress: Progress = binaries.stderr_progress,
                     rebuild: bool = False) -> str:
    """kindest/node:<Kubernetes version> by ``kind build node-image`` from the server tarball
    and the base image (each made first if missing or stale); kept while it was made from
    the present base image and tarball (``rebuild`` rebuilds every step)."""
    base = build_base_image(engine, progress, rebuild)
    tarball = build_server_tarball(engine, progress, rebuild)
    record = work_dir() / "node-image.json"
    made_from = {"base": _image_id(engine, base),
                 "tarball": tarball.with_name(tarball.name + ".inputs").read_text().strip()}
    if not rebuild and images.image_exists(engine, NODE_IMAGE) and record.is_file():
        if json.loads(record.read_text()) == {"image": _image_id(engine, NODE_IMAGE),
                                               "made_from": made_from}:
            progress(f"{NODE_IMAGE}: present")
            return NODE_IMAGE
    kind = binaries.find_binaries(names=["kind"], progress=progress).kind
    started = time.monotonic()
    argv = [str(kind), "build", "node-image", "--type", "file", str(tarball),
            "--base-image", base, "--image", NODE_IMAGE]
    progress(f"building image {NODE_IMAGE}: {' '.join(argv[1:])}")
    result = subprocess.run(argv, env=engine.env(), capture_output=True, text=True,
                            timeout=1800)
    if result.returncode != 0:
        raise KindNodeError(f"`kind {' '.join(argv[1:])}` failed (exit {result.returncode}):\n"
                            + "\n".join((result.stderr + result.stdout).strip()
                                        .splitlines()[-30:]))
    record.write_text(json.dumps({"image": _image_id(engine, NODE_IMAGE),
                                  "made_from": made_from}) + "\n")
    progress(f"  {NODE_IMAGE}: built in {_elapsed(started)}, {_size(engine, NODE_IMAGE)}")
    return NODE_IMAGE


STEPS = ("base", "addons", "tarball", "node")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clusters.kind_node",
        description=f"Build the kind node image {NODE_IMAGE} on this machine (base image "
                    f"{BASE_IMAGE}, add-on images, server tarball, node image).")
    parser.add_argument("--only", choices=STEPS, action="append",
                        help="run only these steps (default: all, keeping what exists)")
    parser.add_argument("--rebuild", action="store_true",
                        help="rebuild the steps run even where their result exists")
    args = parser.parse_args(argv)
    try:
        engine = ensure_engine()
        steps = args.only or ["node"]
        started = time.monotonic()
        for step in STEPS:
            if step not in steps:
                continue
            if step == "base":
                build_base_image(engine, rebuild=args.rebuild)
            elif step == "addons":
                build_addon_images(engine, rebuild=args.rebuild)
            elif step == "tarball":
                build_server_tarball(engine, rebuild=args.rebuild)
            else:
                build_node_image(engine, rebuild=args.rebuild)
        binaries.stderr_progress(f"done in {_elapsed(started)}")
    except (KindNodeError, EngineError, binaries.ProvisioningError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
