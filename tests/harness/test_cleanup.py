"""A test session that owns clusters leaves no process behind, however it ends."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from clusters.processes import harness_processes
from clusters.testing import eventually


def _default_sigint() -> None:
    # A shell that starts a job in the background leaves SIGINT ignored, and Python keeps
    # an ignored SIGINT ignored; the child here must be interruptible wherever the suite
    # itself runs.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


INNER_TEST = textwrap.dedent('''
    import os
    import pathlib
    import threading

    def test_holds_clusters(multicluster):
        assert multicluster.manager.reachable()
        pathlib.Path(os.environ["READY_FILE"]).write_text("ready")
        if os.environ["INNER_MODE"] == "fail":
            assert False, "deliberate failure"
        # Keep the session open until the outer test interrupts or kills it.
        threading.Event().wait(120)
''')


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["failing-test", "ctrl-c", "sigkill"])
def test_owned_clusters_are_stopped_when_the_session_ends(tmp_path, ending):
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    basetemp = tmp_path / "inner-base"
    ready = tmp_path / "ready"
    env = dict(os.environ, READY_FILE=str(ready), CLUSTERS_TEST_WORKERS="0",
               INNER_MODE="fail" if ending == "failing-test" else "hold")
    env.pop("CLUSTERS_TEST_STATE_DIR", None)
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "clusters.pytest_plugin",
         "-p", "no:cacheprovider", f"--basetemp={basetemp}", "test_inner.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_default_sigint,
    )
    try:
        eventually(lambda: ready.exists() or inner.poll() is not None, bool,
                   expected="the inner session to start its clusters", timeout=120)
        assert ready.exists(), f"inner session ended early:\n{inner.communicate()[0]}"
        started = harness_processes(basetemp)
        assert started, "inner session's clusters are not running"
        # Each in a process group of its own (a terminal's Ctrl-C goes to the test
        # session's group only) but in the test session's session, which Linux's scheduler
        # weighs as one task with all it runs (autogroup), as it weighs all of Docker's
        # containers as one.
        placed = {pid: (os.getsid(pid), os.getpgid(pid)) for pid in started}
        wrong = {pid: ids for pid, ids in placed.items() if ids != (os.getsid(inner.pid), pid)}
        assert not wrong, (f"expected session {os.getsid(inner.pid)} and a group of their "
                           f"own, saw (session, group): {wrong}")
        if ending == "ctrl-c":
            inner.send_signal(signal.SIGINT)
        elif ending == "sigkill":
            inner.kill()
        output, _ = inner.communicate(timeout=120)
    finally:
        if inner.poll() is None:
            inner.kill()
    if ending == "failing-test":
        assert inner.returncode == 1 and "deliberate failure" in output, output
    eventually(lambda: harness_processes(basetemp), lambda pids: pids == [],
               expected=f"no process of {basetemp} left after a {ending} ending", timeout=30)


def test_kept_clusters_are_refused_to_several_pytest_processes(tmp_path):
    """Under pytest-xdist each process has clusters of its own: clusters kept running
    (``CLUSTERS_TEST_STATE_DIR``) are refused by name, before any test uses them."""
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    kept, ready = tmp_path / "kept", tmp_path / "ready"
    env = dict(os.environ, READY_FILE=str(ready), INNER_MODE="fail",
               CLUSTERS_TEST_STATE_DIR=str(kept))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "clusters.pytest_plugin",
         "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"CLUSTERS_TEST_STATE_DIR={kept} is for one pytest process" in result.stdout, (
        result.stdout)
    assert not ready.exists() and not kept.exists()


@pytest.mark.slow
@pytest.mark.parametrize("after_processes", [1, 8, 14])
def test_ctrl_c_at_any_moment_of_up_leaves_nothing_behind(tmp_path, after_processes):
    """`python -m clusters up` interrupted once some of its processes run (one, during the
    apiservers, during the worker components): every one of them is stopped."""
    state = tmp_path / "state"
    up = subprocess.Popen([sys.executable, "-m", "clusters", "up", "--workers", "2",
                           "--state-dir", str(state)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_default_sigint)
    try:
        eventually(lambda: len(harness_processes(state)),
                   lambda count: count >= after_processes or up.poll() is not None,
                   expected=f"at least {after_processes} harness processes started", timeout=120,
                   interval=0.01)
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, err
    assert "interrupted" in err
    eventually(lambda: harness_processes(state), lambda pids: pids == [],
               expected=f"no process of {state} left after Ctrl-C during up", timeout=30)
