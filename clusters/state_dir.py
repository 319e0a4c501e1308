"""A provider's state directory: its state file replaced atomically, and one harness command
at a time per directory (two terminals, or a test and a terminal, never interleave)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

LOCK_FILE = ".lock"


def save_state(state_file: Path, state: BaseModel) -> None:
    """Write ``state`` as JSON; a reader sees the old file or the new one, never half."""
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(state_file)


@contextlib.contextmanager
def lock_state_dir(directory: Path) -> Iterator[None]:
    """Hold the directory's lock for the duration of one harness command."""
    directory.mkdir(parents=True, exist_ok=True)
    # Appending, not truncating: a command that then refuses the directory changes nothing.
    with open(directory / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
