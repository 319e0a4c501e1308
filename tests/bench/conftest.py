"""Running ``python -m bench`` as its users do, for the smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def run_bench():
    """``run_bench(args, output, timeout)``: the program run to the end with ``args``; its
    printed table and results.json."""
    def run(args: list[str], output: Path, timeout: float) -> tuple[Path, str, dict]:
        done = subprocess.run([sys.executable, "-m", "bench", *args, "--output", str(output),
                               "--log-level", "warning"], capture_output=True, text=True,
                              timeout=timeout, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, (f"python -m bench exited {done.returncode}\n"
                                      f"stdout:\n{done.stdout[-3000:]}\nstderr:\n"
                                      f"{done.stderr[-5000:]}")
        return output, done.stdout, json.loads((output / "results.json").read_text())
    return run
