"""The Docker engine that the images, docker-compose and the kind clusters need.

``ensure_engine`` finds one, in this order, and uses it as it is:
  1. ``$DOCKER_HOST``, when set (it must answer);
  2. the engine on the default socket (a laptop's Docker Desktop or system service);
  3. the project's own engine, already started on ``ENGINE_SOCKET``.
Otherwise it installs Debian's ``docker.io`` (when ``dockerd`` is missing and apt is there) and
starts ``dockerd`` as root with a data directory under the build cache and a socket of its own,
so the project's engine never meets a system one. Only an engine this module started is ever
stopped, and only by ``stop_engine``.

Where the machine's capability bounding set lacks a capability (some sandboxes drop
``CAP_SYS_RESOURCE``), privileged containers (kind's nodes) cannot start under plain runc; the
engine is then started with ``clusters/oci_runtime.py`` as its default runtime, which removes
what the host cannot grant and runs runc.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from clusters import binaries
from clusters.oci_runtime import missing_capabilities
from clusters.state_dir import lock_state_dir

# Short: a unix socket path is limited to about 100 bytes.
ENGINE_RUN_DIR = Path(os.environ.get("TRAINJOB_ENGINE_RUN_DIR", "/run/trainjob-docker"))
ENGINE_SOCKET = ENGINE_RUN_DIR / "docker.sock"
RUNTIME_NAME = "trainjob-runc"
DEFAULT_SOCKET = Path("/var/run/docker.sock")
# CLI plugins the project builds from their Go modules when the docker client lacks them.
CLI_PLUGINS = ("docker-buildx", "docker-compose")


class EngineError(RuntimeError):
    """No engine answers and none could be started; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Engine:
    """An engine that answers: where it listens and whether this project started it."""

    host: str
    started_here: bool = False

    def env(self) -> dict[str, str]:
        """The environment for a docker or docker compose command against this engine."""
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str, check: bool = True, capture: bool = True,
               timeout: float | None = None, stdin: bytes | None = None
               ) -> subprocess.CompletedProcess:
        """Run ``docker ARGS`` against this engine; a failure raises with its output."""
        result = subprocess.run(["docker", *args], env=self.env(), input=stdin,
                                capture_output=capture, timeout=timeout)
        if check and result.returncode != 0:
            output = (result.stderr or b"").decode(errors="replace").strip()
            raise EngineError(f"`docker {' '.join(args)}` failed (exit {result.returncode})"
                              f": {output[-2000:]}")
        return result


def engine_dir() -> Path:
    """Where the project's engine keeps images, containers and volumes (kept between runs,
    so a warm build reuses its layers)."""
    return binaries.cache_root() / "docker"


def _answers(host: str) -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                env={**os.environ, "DOCKER_HOST": host},
                                capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def find_engine() -> Engine | None:
    """An engine that answers now, without starting anything."""
    if host := os.environ.get("DOCKER_HOST"):
        if not _answers(host):
            raise EngineError(f"DOCKER_HOST={host} is set but no Docker engine answers there; "
                              "start it, or unset DOCKER_HOST to let the project start one")
        return Engine(host)
    for socket in (DEFAULT_SOCKET, ENGINE_SOCKET):
        if socket.exists() and _answers(f"unix://{socket}"):
            return Engine(f"unix://{socket}")
    return None


def ensure_engine(progress=binaries.stderr_progress, install: bool = True,
                  timeout: float = 60) -> Engine:
    """An engine that answers: the one found, or the project's own, installed and started."""
    if engine := find_engine():
        return engine
    if os.geteuid() == 0:
        # Two callers at once (two test processes): one installs and starts, the other finds.
        with lock_state_dir(ENGINE_RUN_DIR):
            if engine := find_engine():
                return engine
            return _install_and_start(progress, install, timeout)
    return _install_and_start(progress, install, timeout)


def _install_and_start(progress, install: bool, timeout: float) -> Engine:
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        if not install:
            raise EngineError("no Docker engine answers and dockerd is not installed")
        install_engine(progress)
    return start_engine(progress, timeout)


def install_engine(progress=binaries.stderr_progress) -> None:
    """Debian's Docker engine (docker.io: dockerd, containerd, runc)."""
    install_debian_packages(("docker.io",), "no Docker engine answers here: install one "
                            "(Debian/Ubuntu: apt-get install docker.io) or start yours and "
                            "set DOCKER_HOST", progress)


def install_debian_packages(packages: tuple[str, ...], otherwise: str,
                            progress=binaries.stderr_progress) -> None:
    """``apt-get install`` as root; where that cannot be, an error that says ``otherwise``."""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise EngineError(otherwise)
    progress(f"installing Debian's {', '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise EngineError(f"`{' '.join(command)}` failed: {result.stderr.strip()[-1500:]}")


def _runtime_wrapper() -> Path:
    """The capability-trimming runtime, copied next to the engine (dockerd runs it by path)."""
    target = ENGINE_RUN_DIR / "oci-runtime"
    source = Path(__file__).with_name("oci_runtime.py").read_text()
    # The system interpreter: the engine outlives any virtualenv that started it.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    target.write_text(f"#!{python}\n" + source)
    target.chmod(0o755)
    return target


def start_engine(progress=binaries.stderr_progress, timeout: float = 60) -> Engine:
    """Start dockerd with the project's data directory and socket; wait until it answers."""
    if os.geteuid() != 0:
        raise EngineError("no Docker engine answers, and starting one needs root: start "
                          "Docker and set DOCKER_HOST, or run as root")
    ENGINE_RUN_DIR.mkdir(parents=True, exist_ok=True)
    data = engine_dir()
    data.mkdir(parents=True, exist_ok=True)
    argv = ["dockerd", f"--data-root={data}", f"--exec-root={ENGINE_RUN_DIR / 'exec'}",
            f"--pidfile={ENGINE_RUN_DIR / 'dockerd.pid'}", f"--host=unix://{ENGINE_SOCKET}",
            # Its own containerd namespaces: a system containerd's images stay apart.
            "--containerd-namespace=trainjob", "--containerd-plugins-namespace=trainjob-plugins",
            # Published ports default to loopback: nothing is offered beyond this machine.
            "--ip=127.0.0.1"]
    missing = missing_capabilities()
    if missing:
        argv += [f"--add-runtime={RUNTIME_NAME}={_runtime_wrapper()}",
                 f"--default-runtime={RUNTIME_NAME}"]
    progress(f"starting dockerd (data in {data}, socket {ENGINE_SOCKET}"
             + (f"; runtime without {', '.join(sorted(missing))}" if missing else "") + ")")
    log_file = ENGINE_RUN_DIR / "dockerd.log"
    with open(log_file, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   close_fds=True)
    (ENGINE_RUN_DIR / "started-by-trainjob").write_text(str(process.pid))
    host = f"unix://{ENGINE_SOCKET}"
    deadline = time.monotonic() + timeout
    while not _answers(host):
        if process.poll() is not None:
            raise EngineError(f"dockerd exited with {process.returncode}: "
                              f"{_tail(log_file)}")
        if time.monotonic() > deadline:
            raise EngineError(f"dockerd did not answer on {ENGINE_SOCKET} within {timeout:.0f}"
                              f" s: {_tail(log_file)}")
        time.sleep(0.5)
    return Engine(host, started_here=True)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_engine(timeout: float = 30) -> bool:
    """Stop the project's own dockerd (and the containerd it runs); False if none runs."""
    marker = ENGINE_RUN_DIR / "started-by-trainjob"
    try:
        pid = int(marker.read_text())
    except (OSError, ValueError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        marker.unlink(missing_ok=True)
        return False
    if b"dockerd" not in cmdline or str(ENGINE_SOCKET).encode() not in cmdline:
        marker.unlink(missing_ok=True)  # the PID was reused by another process
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    marker.unlink(missing_ok=True)
    return True


# --- CLI plugins ----------------------------------------------------------------------


def plugin_dir() -> Path:
    """Where the docker client looks for CLI plugins: the system directory as root (as
    Docker's packages install them), else the user's."""
    if os.geteuid() == 0:
        return Path("/usr/local/lib/docker/cli-plugins")
    return Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "cli-plugins"


def _has_plugin(engine: Engine, name: str) -> bool:
    command = name.removeprefix("docker-")
    result = subprocess.run(["docker", command, "version"], env=engine.env(),
                            capture_output=True, timeout=30)
    return result.returncode == 0


def ensure_cli_plugins(engine: Engine, progress=binaries.stderr_progress) -> None:
    """``docker buildx`` (BuildKit builds with secrets) and ``docker compose``: built from
    their Go modules and installed as CLI plugins where the client has none."""
    for name in CLI_PLUGINS:
        if _has_plugin(engine, name):
            continue
        path = binaries.find_binaries(names=[name], progress=progress).paths[name]
        target = plugin_dir() / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        shutil.copy2(path, target)
        progress(f"installed {name} as a docker CLI plugin in {target.parent}")


def describe(engine: Engine) -> dict:
    """What the engine reports of itself, for `python -m clusters engine status`."""
    result = engine.docker("info", "--format", "{{json .}}")
    info = json.loads(result.stdout)
    return {"host": engine.host, "started_here": engine.started_here,
            "server_version": info.get("ServerVersion"), "driver": info.get("Driver"),
            "cgroup_version": info.get("CgroupVersion"),
            "default_runtime": info.get("DefaultRuntime")}
