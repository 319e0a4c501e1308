"""kind provider: the same manager + workers layout as kind clusters, for machines with Docker.

Each cluster is ``kind`` cluster ``trainjob-<name>`` built from the configs beside this file.
Two kubeconfigs per cluster are written: ``<name>.kubeconfig`` for the host, and
``<name>.internal.kubeconfig`` addressing the control-plane container on the ``kind`` Docker
network, which is what a dispatcher running *inside* the manager cluster needs in its
MultiKueueCluster Secrets. stop/start map to ``docker stop``/``docker start`` of the
control-plane container (etcd data lives in the container, so objects survive).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from clusters import binaries, crds, kustomize
from clusters.controlplane import ControlPlaneError
from clusters.local import ClusterInfo, cluster_names
from trainjob.kubeclient import api_client

# The node image matching the Kubernetes minor the local provider builds.
NODE_IMAGE = "kindest/node:v1.34.0"
CONFIG_DIR = Path(__file__).resolve().parent
PREFIX = "trainjob-"


def _run(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        raise ControlPlaneError(
            f"`{argv[0]}` is not on PATH; the kind provider needs kind and a Docker engine. "
            "Without Docker use the default local provider."
        )
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


# kind workers have kubelets and a scheduler; what they lack is JobSet. Its release is
# rendered from the JobSet module's own kustomization, with the published image.
JOBSET_IMAGE = "registry.k8s.io/jobset/jobset"


def _install_jobset_release(kubeconfig: Path) -> None:
    version = binaries.COMPONENTS["jobset-controller"].version
    source = binaries.module_dir("jobset-controller") / "config" / "default"
    rendered = kustomize.kubectl(None, "kustomize", str(source))
    if rendered.returncode != 0:
        raise ControlPlaneError(f"kubectl kustomize {source} failed: {rendered.stderr.strip()}")
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    for document in documents:
        for container in (((document.get("spec") or {}).get("template") or {}).get("spec")
                          or {}).get("containers") or []:
            if container.get("image", "").endswith(f"/jobset:{version}"):
                container["image"] = f"{JOBSET_IMAGE}:{version}"
    kustomize.apply(kubeconfig, documents)


class KindClusters:
    def __init__(self, state_dir: Path | str):
        self.state_dir = Path(state_dir).resolve()

    def kubeconfig(self, name: str) -> Path:
        return self.state_dir / f"{name}.kubeconfig"

    def _existing(self) -> list[str]:
        out = _run("kind", "get", "clusters")
        return sorted(n[len(PREFIX):] for n in out.split() if n.startswith(PREFIX))

    def up(self, workers: int = 2, timeout: float = 300, node_layout=None,
           max_workers: int | None = None,
           upstream_crds: tuple[str, ...] = ()) -> list[ClusterInfo]:
        # kind workers have real kubelet Nodes; the kwok Node flags are the local provider's.
        del node_layout
        self.state_dir.mkdir(parents=True, exist_ok=True)
        existing = set(self._existing())
        for name in cluster_names(workers):
            config = CONFIG_DIR / ("manager.yaml" if name == "manager" else "worker.yaml")
            if name not in existing:
                _run("kind", "create", "cluster", "--name", PREFIX + name, "--image", NODE_IMAGE,
                     "--config", str(config), "--kubeconfig", str(self.kubeconfig(name)),
                     "--wait", f"{int(timeout)}s")
            self.kubeconfig(name).write_text(_run("kind", "get", "kubeconfig", "--name", PREFIX + name))
            (self.state_dir / f"{name}.internal.kubeconfig").write_text(
                _run("kind", "get", "kubeconfig", "--internal", "--name", PREFIX + name)
            )
            role = "manager" if name == "manager" else "worker"
            with api_client(self.kubeconfig(name)) as client:
                flavour = crds.UPSTREAM if name in upstream_crds else crds.PROJECT
                crds.install_crds(client, crds.cluster_crds(role, flavour), timeout)
            if role == "worker":
                _install_jobset_release(self.kubeconfig(name))
        return self.status()

    def status(self) -> list[ClusterInfo]:
        infos = []
        for name in self._existing():
            running = _run("docker", "inspect", "-f", "{{.State.Running}}",
                           f"{PREFIX}{name}-control-plane").strip() == "true"
            server = ""
            if self.kubeconfig(name).exists():
                config = yaml.safe_load(self.kubeconfig(name).read_text())
                server = config["clusters"][0]["cluster"]["server"]
            infos.append(ClusterInfo(
                name=name, role="manager" if name == "manager" else "worker", server=server,
                kubeconfig=str(self.kubeconfig(name)), state="running" if running else "stopped",
            ))
        return infos

    def stop(self, name: str) -> ClusterInfo:
        _run("docker", "stop", f"{PREFIX}{name}-control-plane")
        return next(i for i in self.status() if i.name == name)

    def start(self, name: str, timeout: float = 120) -> ClusterInfo:
        _run("docker", "start", f"{PREFIX}{name}-control-plane")
        return next(i for i in self.status() if i.name == name)

    def down(self) -> None:
        for name in self._existing():
            _run("kind", "delete", "cluster", "--name", PREFIX + name)
        shutil.rmtree(self.state_dir, ignore_errors=True)
