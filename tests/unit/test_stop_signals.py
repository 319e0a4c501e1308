"""SIGTERM stops a controller process whichever of its threads the kernel delivers it to
(``controller_kit.stop_signals``), and the handlers in place before are put back."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from clusters.testing import eventually
from controller_kit.stop_signals import StopSignals

# A process serving as the dispatcher and the operator do (``serve``), with one more thread:
# told so on stdin, that thread sends SIGTERM to itself, so the signal arrives on it and not
# on the main thread, which waits for the stop.
CHILD = '''
import logging, signal, sys, threading
from clusters.controlplane import free_port
from controller_kit.manager import Manager, Runnable
from controller_kit.service import Listeners, serve

def bystander():
    sys.stdin.readline()
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Event().wait()

logging.basicConfig(level=logging.INFO)
manager = Manager("child")
manager.add(Runnable("bystander", start=lambda _: threading.Thread(
    target=bystander, daemon=True).start()))
sys.exit(serve("child", manager, None, Listeners("127.0.0.1", free_port()),
               gc_sweep_seconds=0))
'''


def test_a_sigterm_caught_by_another_thread_than_the_main_one_stops_the_process(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    log = tmp_path / "child.log"
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                 stdout=out, stderr=subprocess.STDOUT, text=True,
                                 cwd=Path(__file__).resolve().parents[2])
    try:
        eventually(log.read_text, lambda text: "child running" in text, timeout=30,
                   expected="the child serving")
        child.stdin.write("go\n")
        child.stdin.flush()
        try:
            code = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("expected the child to stop on the SIGTERM its other thread "
                                 f"caught; still running 30 s later. Its log: "
                                 f"{log.read_text()}") from None
    finally:
        child.kill()
        child.wait()
    text = log.read_text()
    assert code == 0, text
    assert "child stopping (SIGTERM)" in text and "child stopped" in text, text


def test_stop_on_a_signal_and_the_earlier_handlers_back_after():
    def earlier(*_):
        raise AssertionError("the earlier handler ran while StopSignals was installed")

    before = signal.signal(signal.SIGTERM, earlier)
    try:
        stop = threading.Event()
        with StopSignals("test", stop) as signals:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            eventually(stop.is_set, bool, timeout=10, expected="the stop set by SIGTERM")
            assert signals.received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is earlier
        assert signal.set_wakeup_fd(-1) == -1, "the wakeup fd was not given back"
    finally:
        signal.signal(signal.SIGTERM, before)
