"""Starting, recognising and stopping the harness's own child processes.

Every process the harness starts carries a path under its state directory on its command
line; ``is_harness_process`` checks that before anything is signalled, so a recycled PID
that now belongs to someone else is never killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1

# Every process the harness spawns is a Go server (etcd, the Kubernetes components, JobSet,
# kwok, Kueue, Trainer). At Go's default GOGC=100 an idle apiserver spends a third of its CPU
# collecting garbage; at 400 its start takes a quarter less CPU and its idling a third less,
# for about 200 MiB more memory each (see WORKER_MEMORY_BYTES). On a two-core machine
# running several clusters, CPU is what runs out first.
#
# GOMAXPROCS: three clusters are a dozen Go servers or more on the machine at once, each
# running goroutines on as many threads as there are cores by default; what wakes one
# wakes its idle threads to look for work, and they contend with every other server's. At
# half the cores each (one thread on two cores) the same test module took 5-9 % less CPU,
# its apiservers 7-11 % and etcd 12-30 % less, in the same time.
#
# A setting in the caller's environment wins. The kind provider gives the same settings to
# its nodes' components.
GO_RUNTIME_DEFAULTS = {"GOGC": "400", "GOMAXPROCS": str(max(1, (os.cpu_count() or 1) // 2))}


def go_runtime_env() -> dict[str, str]:
    """GO_RUNTIME_DEFAULTS, each overridden by the caller's environment."""
    return {key: os.environ.get(key, value) for key, value in GO_RUNTIME_DEFAULTS.items()}


def die_with_parent() -> None:
    # Runs in the child between fork and exec. If the process that owns the clusters (a
    # pytest session, say) is SIGKILLed, the kernel sends SIGTERM here, so no apiserver
    # outlives it. The kernel ties this to the creating *thread*, so a caller spawns from a
    # thread that lives as long as the child: the main thread, or (ServiceProcess's
    # restarts) the supervising thread that waits on the very process it started.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(argv: list[str], log_file: Path, *, tied_to_parent: bool,
          env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in a process group of its own with output appended to ``log_file``;
    return its PID. ``env`` is added to this process's environment (and go_runtime_env) for
    the child.

    A process that outlives its caller (``tied_to_parent`` false: ``clusters up``) gets a
    session of its own too, away from the caller's terminal. One tied to its caller stays
    in the caller's session: Linux's scheduler (autogroup, on by default) weighs each
    session as one task, so the dozen processes of three clusters, each in a session of
    its own, would each weigh as much as all of Docker's containers together (one cgroup,
    one weight), and kind's nodes would starve while a test session runs both."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Either way Ctrl-C in a terminal must not hit etcd before the apiserver.
            start_new_session=not tied_to_parent,
            process_group=0 if tied_to_parent else None,
            preexec_fn=die_with_parent if tied_to_parent else None,
            close_fds=True,
            env={**os.environ, **go_runtime_env(), **(env or {})},
        )
    _children[proc.pid] = proc
    _argv[proc.pid] = " ".join(argv).encode()
    return proc.pid


# Popen objects of the processes this interpreter started, so their exit status is
# collected (no zombies) and liveness checks see an exited child as dead; and the command
# each was started with.
_children: dict[int, subprocess.Popen] = {}
_argv: dict[int, bytes] = {}


def is_alive(pid: int | None) -> bool:
    if not pid:
        return False
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def is_harness_process(pid: int | None, marker: Path) -> bool:
    """True when ``pid`` is alive and its command line mentions ``marker`` (a state dir)."""
    if not is_alive(pid):
        return False
    # The trailing separator keeps /tmp/a from matching /tmp/ab.
    needle = (str(marker).rstrip("/") + "/").encode()
    if pid in _argv:
        # Started by this interpreter: judge by the command it was given. (Between fork
        # and exec /proc still shows the parent's command line.)
        return needle in _argv[pid]
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return needle in cmdline


def terminate(pid: int, marker: Path, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; only if the process is ours."""
    if not is_harness_process(pid, marker):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(pid):
            break
        time.sleep(0.05)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # SIGKILL is not ignorable; wait briefly so the port is free before a restart.
        deadline = time.monotonic() + 5
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    child = _children.pop(pid, None)
    _argv.pop(pid, None)
    if child is not None:
        child.poll()


def terminate_all(pids: list[int], marker: Path, grace: float = 10.0) -> None:
    """``terminate`` for many at once: every one is asked to stop before any is waited for,
    so stopping a hundred processes takes one grace period, not a hundred."""
    ours = [pid for pid in pids if is_harness_process(pid, marker)]
    for pid in ours:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(pid) for pid in ours):
        time.sleep(0.05)
    for pid in ours:
        terminate(pid, marker, grace=0)  # SIGKILL what is left; reap


def harness_processes(marker: Path) -> list[int]:
    """Every live process whose command line mentions ``marker``: for leak checks."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if is_harness_process(int(entry.name), marker):
                found.append(int(entry.name))
    return found


def log_tail(log_file: Path, lines: int = 20) -> str:
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])
