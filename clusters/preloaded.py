"""The project's commands started from an interpreter that has imported them already: a
test run starts a few hundred dispatchers and training operators, and each new interpreter
spends most of a CPU-second importing the Kubernetes client, cryptography and pydantic before
it does anything; a forked one starts with them in memory.

``Launcher`` runs ``python -m clusters.preloaded`` (the server below): it imports the
commands' modules once, then for each request forks a child that runs
``python -m <module> <args>`` as the interpreter would (``runpy``, its own argv, working
directory, environment, stdout and stderr to a log file) and reports when a child ends and
how (the exit code, or minus the signal). The child is a real process of its own, signalled
and waited for through a ``Launched``, which answers like ``subprocess.Popen``.

A child lives no longer than the process that asked for it: the server ends its children
(SIGTERM) and itself when its request pipe closes, which happens when the asking process
ends, however it ends; each child also has the server as parent-death signal. The server
forks from its only thread, so a child holds no lock another thread held."""

from __future__ import annotations

import ctypes
import gc
import importlib
import io
import json
import os
import pkgutil
import runpy
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

# The packages the commands are made of: every module of theirs is imported before the
# first fork (the commands import part of theirs only once running).
PRELOADED = ("dispatcher", "training_operator", "controller_kit", "trainjob")
PR_SET_PDEATHSIG = 1


class Launched:
    """A child of the server, with the part of ``subprocess.Popen`` the tests use. Its exit
    is known by the number of the request that started it: the server reaps a child at
    once, and its pid may be another process's soon after."""

    def __init__(self, launcher: Launcher, ask: int, pid: int):
        self._launcher = launcher
        self._ask = ask
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._launcher.exit_code(self._ask)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._launcher.wait_exit(self._ask, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return code

    def send_signal(self, sig: int) -> None:
        # Not once its end is known (its pid may be reused); between the server reaping it
        # and that report arriving, a new process would have to take the very same pid.
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """The asking side: starts the server on first use, sends it requests, and keeps the
    exit codes it reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server: subprocess.Popen | None = None
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self._running: set[int] = set()
        self._next = 0

    def _ensure_server(self) -> subprocess.Popen:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "clusters.preloaded"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, bufsize=0)
            threading.Thread(target=self._read, args=(self._server,), daemon=True,
                             name="preloaded-replies").start()
        return self._server

    def _read(self, server: subprocess.Popen) -> None:
        for line in io.BufferedReader(server.stdout):
            message = json.loads(line)
            with self._changed:
                if "exit" in message:
                    self._exits[message["exit"]] = message["code"]
                    self._running.discard(message["exit"])
                else:
                    self._replies[message["id"]] = message
                self._changed.notify_all()
        with self._changed:
            # The server is gone: its parent-death signal (SIGTERM) ended every child.
            for ask in self._running:
                self._exits[ask] = -signal.SIGTERM
            self._running.clear()
            self._changed.notify_all()

    def start(self, module: str, args: list[str], log_file: Path,
              cwd: Path | None = None, env: dict[str, str] | None = None) -> Launched:
        """``python -m module *args`` with stdout and stderr appended to ``log_file``."""
        with self._changed:
            server = self._ensure_server()
            self._next += 1
            ask = self._next
            server.stdin.write(json.dumps({
                "id": ask, "module": module, "args": list(args), "log": str(log_file),
                "cwd": str(cwd or Path.cwd()), "env": dict(os.environ if env is None else env),
            }).encode() + b"\n")
            if not self._changed.wait_for(lambda: ask in self._replies
                                          or server.poll() is not None, timeout=60):
                raise RuntimeError(f"clusters.preloaded: no answer to starting {module} "
                                   "within 60 s")
            reply = self._replies.pop(ask, None)
        if reply is None:
            raise RuntimeError(f"clusters.preloaded ended (exit code {server.poll()}) "
                               f"before starting {module}")
        if "error" in reply:
            raise RuntimeError(f"clusters.preloaded could not start {module}: "
                               f"{reply['error']}")
        with self._lock:
            if ask not in self._exits:
                self._running.add(ask)
        return Launched(self, ask, reply["pid"])

    def close(self, timeout: float = 30) -> None:
        """End the server and, with it, every child still running (SIGTERM)."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.stdin.close()
            server.wait(timeout)

    def exit_code(self, ask: int) -> int | None:
        with self._lock:
            return self._exits.get(ask)

    def wait_exit(self, ask: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: ask in self._exits, timeout=timeout)
            return self._exits.get(ask)


_ENABLED: Launcher | None = None


def enable() -> Launcher:
    """From now on, ``clusters.testing.ServiceProcess`` starts its commands through one
    ``Launcher`` of this process (the test plugin's choice; the demo starts them plainly)."""
    global _ENABLED
    if _ENABLED is None:
        _ENABLED = Launcher()
    return _ENABLED


def enabled() -> Launcher | None:
    return _ENABLED


# --- the server --------------------------------------------------------------------------

def _reply(message: dict) -> None:
    os.write(1, json.dumps(message).encode() + b"\n")


def _child(request: dict) -> None:
    """In the forked child: become ``python -m <module> <args>``. Returns only by raising
    (SystemExit included), so that the interpreter ends as a command's would."""
    ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    gc.enable()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"], *request["args"]]
    sys.path[0] = request["cwd"]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _reap(children: dict[int, int]) -> None:
    """Report each ended child by the request that started it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reply({"exit": children.pop(pid), "code": os.waitstatus_to_exitcode(status)})


def serve() -> None:
    # What the imports made is moved out of the collector's sight (gc.freeze): a child's
    # collections do not walk it, nor copy its pages by writing to them, until the command's
    # own full sweep (controller_kit.gc_pauses) hands it back, once, after its caches sync.
    gc.disable()
    for name in PRELOADED:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if module.name.rsplit(".", 1)[-1] != "__main__":
                importlib.import_module(module.name)
    # The Kubernetes client imports its API classes when first named; name them.
    import kubernetes.client
    for attribute in getattr(kubernetes.client, "__all__", ()):
        if attribute.endswith("Api"):
            getattr(kubernetes.client, attribute)
    gc.freeze()
    children: dict[int, int] = {}  # pid -> the request that started it
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    # A handler (not SIG_DFL, which ignores SIGCHLD) so that the wakeup fd hears of it.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    requests = os.fdopen(0, "rb", buffering=0)
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(children)
        if 0 not in ready:
            continue
        chunk = requests.read(65536)
        if not chunk:
            break  # the asking process has ended
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as err:
                _reply({"id": request["id"], "error": str(err)})
                continue
            if pid == 0:
                os.close(wake_read)
                os.close(wake_write)
                _child(request)
            children[pid] = request["id"]
            _reply({"id": request["id"], "pid": pid})
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    serve()
