"""``clusters.preloaded``: a command forked from the preloaded interpreter runs as
``python -m <module>`` would (argv, working directory, environment, log, exit code, an
unhandled exception), answers signals like a ``Popen``, and does not outlive the process
that asked for it. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusters.preloaded import Launcher
from clusters.testing import eventually

# A command of its own, found from its working directory as `python -m` finds one.
COMMAND = '''
import json, os, signal, sys

if sys.argv[1] == "report":
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "main": __name__,
                      "marker": os.environ.get("PRELOADED_TEST_MARKER")}))
    sys.exit(3)
if sys.argv[1] == "raise":
    raise RuntimeError("the command's own error")
if sys.argv[1] == "wait":
    print("waiting", flush=True)
    signal.pause()
'''


@pytest.fixture
def command_dir(tmp_path: Path) -> Path:
    (tmp_path / "preloaded_probe.py").write_text(textwrap.dedent(COMMAND))
    return tmp_path


@pytest.fixture
def launcher():
    made = Launcher()
    yield made
    made.close()


def test_a_command_runs_with_its_argv_directory_environment_and_exit_code(
        launcher, command_dir):
    log = command_dir / "report.log"
    env = {**os.environ, "PRELOADED_TEST_MARKER": "set for this one"}
    child = launcher.start("preloaded_probe", ["report", "--flag", "x"], log,
                           cwd=command_dir, env=env)
    assert child.wait(60) == 3
    assert child.poll() == 3 and child.returncode == 3
    report = json.loads(log.read_text())
    assert report == {"argv": ["report", "--flag", "x"], "cwd": str(command_dir),
                      "main": "__main__", "marker": "set for this one"}, report


def test_an_unhandled_exception_ends_it_with_1_and_its_traceback_in_the_log(
        launcher, command_dir):
    log = command_dir / "raise.log"
    child = launcher.start("preloaded_probe", ["raise"], log, cwd=command_dir)
    assert child.wait(60) == 1
    text = log.read_text()
    assert "Traceback" in text and "RuntimeError: the command's own error" in text, text


def test_signals_and_waits_answer_as_popen(launcher, command_dir):
    log = command_dir / "wait.log"
    child = launcher.start("preloaded_probe", ["wait"], log, cwd=command_dir)
    eventually(log.read_text, lambda text: "waiting" in text,
               expected=f"the command to log 'waiting' in {log}")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.send_signal(signal.SIGTERM)
    assert child.wait(60) == -signal.SIGTERM
    child.kill()  # ended: nothing is signalled


def test_the_children_end_with_the_process_that_asked(command_dir):
    asker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import os, sys
        from pathlib import Path
        from clusters.preloaded import Launcher
        child = Launcher().start("preloaded_probe", ["wait"], Path("{command_dir}") / "w.log",
                                 cwd=Path("{command_dir}"))
        print(child.pid, flush=True)
        sys.stdin.read()
    ''')], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).parents[2])
    pid = int(asker.stdout.readline())
    os.kill(pid, 0)  # running
    asker.kill()
    asker.wait(30)

    def alive() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        return state != "Z"

    eventually(alive, lambda running: not running,
               expected=f"command {pid} to end once the process that asked for it was killed")
