"""Running ``python -m bench`` as its users do, for the smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusters.testing import machine_load, stretched

# How long a program told to stop (SIGTERM) may take to stop its clusters and write results.
STOP_SECONDS = 180


@pytest.fixture(scope="session")
def load_aware():
    """``stretched`` for the tests: a wait's seconds on this machine as busy as it is now."""
    return stretched


@pytest.fixture(scope="session")
def run_bench():
    """``run_bench(args, output, timeout)``: the program run to the end with ``args``; its
    printed table and results.json. ``timeout`` is for an idle machine and is stretched by
    the load (``stretched``)."""
    def run(args: list[str], output: Path, timeout: float) -> tuple[Path, str, dict]:
        limit = stretched(timeout)
        process = subprocess.Popen([sys.executable, "-m", "bench", *args, "--output",
                                    str(output), "--log-level", "warning"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=Path(__file__).resolve().parents[2])
        try:
            stdout, stderr = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            # SIGTERM, not the SIGKILL of subprocess.run: the program then stops its
            # clusters, which would otherwise go on loading the machine for later tests.
            process.terminate()
            try:
                _, stderr = process.communicate(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
            raise AssertionError(
                f"expected python -m bench {' '.join(args)} to end within {limit:.0f} s "
                f"({timeout:g} s stretched by the load: {machine_load()}); it was "
                f"still running and was stopped. Its last output:\n{stderr[-5000:]}") from None
        done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        assert done.returncode == 0, (f"python -m bench exited {done.returncode}\n"
                                      f"stdout:\n{done.stdout[-3000:]}\nstderr:\n"
                                      f"{done.stderr[-5000:]}")
        return output, done.stdout, json.loads((output / "results.json").read_text())
    return run
