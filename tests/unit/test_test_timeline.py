"""``clusters.test_timeline``: a run in two pytest-xdist processes writes each process's span,
each module's process, start and wall time, and the machine's figures (the CPU probe at the start
and end, the CPU of the processes the run started). Run as a real pytest session."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from clusters.test_timeline import cpu_probe
from clusters.testing import run_pytest_session

# A test that starts a process doing about a CPU-second of work (on an unloaded machine).
BUSY_CHILD = '''
import subprocess
import sys


def test_busy_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(20_000_000))"], check=True)
'''


def test_a_two_process_run_records_processes_modules_and_the_machine(tmp_path: Path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["clusters.test_timeline"]\n')
    (tmp_path / "test_busy.py").write_text(textwrap.dedent(BUSY_CHILD))
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    assert True\n")
    run = run_pytest_session(tmp_path, "-n", "2", "--dist", "loadscope", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "time per pytest process" in run.stdout and "machine: a fixed piece" in run.stdout

    timeline = json.loads((tmp_path / "test-artifacts" / "test-timeline.json").read_text())
    assert set(timeline["processes"]) == {"gw0", "gw1"}, timeline["processes"]
    modules = {row["module"]: row for row in timeline["modules"]}
    assert set(modules) == {"test_busy.py", "test_quick.py"}, modules
    assert modules["test_busy.py"]["process"] != modules["test_quick.py"]["process"]
    # Each in a process of its own, both start with the run (within the workers' start-up).
    assert all(0 <= row["started_at_seconds"] < 60 for row in modules.values()), modules
    assert min(row["started_at_seconds"] for row in modules.values()) == 0, modules
    machine = timeline["machine"]
    assert 0 < machine["cpu_probe_seconds_at_start"] < 10, machine
    assert 0 < machine["cpu_probe_seconds_at_end"] < 10, machine
    # The busy child is the workers' child, reaped through them: its CPU counts. It does ten
    # times the probe's work; at least a quarter of that must show.
    assert machine["reaped_processes_cpu_seconds"] >= 2.5 * cpu_probe(1), machine
