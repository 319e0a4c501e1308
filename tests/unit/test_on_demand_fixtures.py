"""``clusters.pytest_plugin.on_demand``: what a fixture starts for the modules that ask for it
is stopped after the last of a run of such modules, before the next module runs, and started
anew for a later module that asks again. Run as a real pytest session in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = '''
import itertools

import pytest

from clusters.pytest_plugin import on_demand

pytest_plugins = ["clusters.pytest_plugin"]
LOG = __import__("pathlib").Path(__file__).with_name("log.txt")
COUNT = itertools.count(1)


def log(line):
    with LOG.open("a") as out:
        out.write(line + "\\n")


@pytest.fixture(scope="session")
def _thing(pytestconfig):
    def start():
        number = next(COUNT)
        log(f"start {number}")
        try:
            yield number
        finally:
            log(f"stop {number}")

    made = on_demand(pytestconfig, "thing", start)
    yield made
    made.stop()


@pytest.fixture(scope="module")
def thing(_thing):
    return _thing.get()


@pytest.fixture(scope="module")
def uses_thing(thing):
    # A module fixture built on it: finalized before the thing stops.
    yield thing
    log(f"module fixture on {thing} done")


@pytest.fixture(autouse=True)
def named(request):
    log(request.node.nodeid)
'''

MODULES = {
    # The second test does not ask: the module's first did, so the thing stays.
    "test_a.py": "def test_a1(thing): pass\n\ndef test_a2(): pass\n",
    "test_b.py": "def test_b1(uses_thing): pass\n",
    "test_c.py": "def test_c1(): pass\n",
    "test_d.py": "def test_d1(thing): pass\n",
}


def test_stopped_after_the_last_module_asking_and_started_again_for_a_later_one(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "log.txt").read_text().splitlines() == [
        "start 1", "test_a.py::test_a1", "test_a.py::test_a2", "test_b.py::test_b1",
        "module fixture on 1 done", "stop 1",
        "test_c.py::test_c1",
        "start 2", "test_d.py::test_d1", "stop 2",
    ]
