"""The coalescer that turns a burst of "room may have freed" into one requeue."""

import threading

from clusters.testing import eventually, holds_for
from dispatcher.coalesce import Coalesced


def test_a_burst_of_triggers_runs_the_action_once():
    runs = []
    coalesced = Coalesced(lambda: runs.append(1), window=0.2)
    for _ in range(50):
        coalesced()
    eventually(lambda: len(runs), lambda count: count == 1,
               expected="one run for a burst of 50 triggers")
    holds_for(lambda: len(runs), lambda count: count == 1, seconds=0.5,
              expected="no second run without a new trigger")


def test_a_trigger_while_the_action_runs_gets_a_run_of_its_own():
    started, release = threading.Event(), threading.Event()
    runs = []

    def action():
        runs.append(1)
        if len(runs) == 1:
            started.set()
            release.wait(5)

    coalesced = Coalesced(action, window=0.01)
    coalesced()
    assert started.wait(5), "the first run did not start"
    coalesced()  # arrives while the first run still looks at the old state
    release.set()
    eventually(lambda: len(runs), lambda count: count == 2,
               expected="a second run for the trigger that came during the first")


def test_a_failing_action_does_not_stop_later_runs():
    runs = []

    def action():
        runs.append(1)
        raise RuntimeError("boom")

    coalesced = Coalesced(action, window=0.01)
    coalesced()
    eventually(lambda: len(runs), lambda count: count == 1, expected="the first run")
    coalesced()
    eventually(lambda: len(runs), lambda count: count == 2,
               expected="a run after one that raised")
