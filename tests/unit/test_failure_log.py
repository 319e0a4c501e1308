"""``clusters.failure_log``: a failure is written to ``test-artifacts/failures.txt`` while the
run still goes on, naming the process, the test, the phase and why; passes write nothing;
a new run starts with an empty file. Run as real pytest sessions in two processes."""

from __future__ import annotations

import textwrap
from pathlib import Path

from clusters.testing import run_pytest_session

# The second test waits until the log names the first one's failure, so the run passes
# only if the failure was written while the run was still going on.
TESTS = '''
from pathlib import Path

from clusters.testing import eventually


def test_fails():
    assert 1 + 1 == 3, "arithmetic says no"


def test_sees_the_failure_written_before_the_run_ends():
    log = Path("test-artifacts") / "failures.txt"
    eventually(log.read_text, lambda text: "test_fails" in text, timeout=60,
               expected="failures.txt to name test_fails while the run goes on")
'''


def test_failures_are_written_as_they_come_and_a_new_run_starts_empty(tmp_path: Path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["clusters.failure_log"]\n')
    (tmp_path / "test_mixed.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    assert True\n")

    red = run_pytest_session(tmp_path, "-n", "2", "--dist", "load", "test_mixed.py")
    assert red.returncode == 1, red.stdout + red.stderr
    assert "1 failed, 1 passed" in red.stdout, red.stdout
    log = (tmp_path / "test-artifacts" / "failures.txt").read_text()
    first = log.splitlines()[0]
    assert first.endswith(" FAILED in call: test_mixed.py::test_fails"), log
    assert first.split()[1] in {"gw0", "gw1"}, log
    assert "arithmetic says no" in log and "test_sees_the_failure" not in log, log

    green = run_pytest_session(tmp_path, "-n", "2", "--dist", "load", "test_fine.py")
    assert green.returncode == 0, green.stdout + green.stderr
    after = (tmp_path / "test-artifacts" / "failures.txt").read_text()
    assert after == "", f"a green run should leave failures.txt empty; it holds {after!r}"
