"""The images the container and kind tests run, built in the background while the other
tests run: `make test` no longer waits for them before its first test.

On a new machine they are most of the set-up (the Docker engine installed, Debian's base
images, the project's images, kind's node image and its parts), and only the modules under
``tests/containers/`` and ``tests/kind/`` need them. So when a test run has selected one of
those (``start_if_selected``), a process of its own (``python -m clusters.prebuild``)
builds them all, holding a lock on the cache for as long as it builds; the fixtures that
need an image first wait for that lock (``wait``), then find everything built. The other
modules run meanwhile, on what the build leaves of the two cores. What exists is kept, as
``python -m clusters images`` and ``python -m clusters.kind_node`` keep it: on a warm
machine the build takes seconds.

A failed build is reported by the first fixture that waits for it, with the build's log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from clusters import binaries

# The test directories whose modules need the images.
NEEDING = ("tests/containers/", "tests/kind/")


def _lock_file() -> Path:
    return binaries.cache_root() / "prebuild.lock"


def _result_file() -> Path:
    return binaries.cache_root() / "prebuild.json"


def log_file() -> Path:
    return binaries.cache_root() / "prebuild.log"


class PrebuildError(RuntimeError):
    """The background build failed; the message names its log."""


@contextlib.contextmanager
def _locked(blocking: bool) -> Iterator[bool]:
    """Hold the build's lock; yields False (holding nothing) when ``blocking`` is off and
    another process holds it."""
    path = _lock_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def selected(paths: Iterable[str]) -> bool:
    """Whether a run of the tests at ``paths`` (node ids or files) needs the images."""
    return any(path.startswith(NEEDING) for path in paths)


def start_if_selected(paths: Iterable[str]) -> bool:
    """Start the background build when the run needs the images and none runs already;
    whether the run needs them. Its output goes to ``log_file()``."""
    if not selected(paths):
        return False
    with _locked(blocking=False) as free:
        if not free or _starting():
            return True  # building already (another pytest process started it)
        # Written under the lock: a fixture that waits from now on waits for this build.
        _result_file().write_text(json.dumps({"state": "starting", "at": time.time()}))
    with open(log_file(), "w") as log:
        subprocess.Popen([sys.executable, "-m", "clusters.prebuild"], stdout=log,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    return True


def _state() -> dict:
    try:
        return json.loads(_result_file().read_text())
    except (OSError, ValueError):
        return {}


def _starting() -> bool:
    """A build was just started and its process has not taken the lock yet."""
    state = _state()
    return state.get("state") == "starting" and time.time() - state.get("at", 0) < STARTING


# How long a started build's process may take to take the lock (a loaded machine).
STARTING = 120.0


def wait(timeout: float = 3600) -> None:
    """Wait for a background build to end (at once when none runs); raise
    ``PrebuildError`` with its log's last lines when it failed."""
    deadline = time.monotonic() + timeout
    while True:
        with _locked(blocking=False) as free:
            if free and not _starting():
                break
        if time.monotonic() > deadline:
            raise PrebuildError(f"the images' build still runs after {timeout:.0f} s; its log: "
                                f"{log_file()}")
        time.sleep(1.0)  # the builder holds the lock: poll it, a fixture has nothing else to do
    result = _state()  # none: no build was started, the fixtures build what they need
    if result.get("state") == "failed":
        tail = log_file().read_text(errors="replace")[-3000:] if log_file().exists() else ""
        raise PrebuildError(f"building the images failed ({result.get('error')}); the end of "
                            f"{log_file()}:\n{tail}")


def build() -> None:
    """Every image the container and kind tests run, then kind's node image."""
    from clusters import images, kind_node
    from clusters.engine import ensure_engine

    engine = ensure_engine()
    images.build_images(engine)
    kind_node.build_node_image(engine)


def main() -> int:
    with _locked(blocking=True):
        started = time.monotonic()
        _result_file().write_text(json.dumps({"state": "building", "pid": os.getpid()}))
        try:
            build()
        except Exception as err:  # noqa: BLE001 - the waiting fixture reports it
            _result_file().write_text(json.dumps({"state": "failed",
                                                  "error": f"{type(err).__name__}: {err}"}))
            print(f"images: build failed: {type(err).__name__}: {err}", flush=True)
            return 1
        seconds = time.monotonic() - started
        _result_file().write_text(json.dumps({"state": "built", "seconds": round(seconds, 1)}))
        print(f"images: built in {seconds:.0f} s", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
