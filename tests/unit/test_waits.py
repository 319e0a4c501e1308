"""The tests' waits on a busy machine: ``eventually`` and ``holds_for`` stretch their
windows by the load, and say how loaded the machine was when they fail; the kind provider's
waits say how far a cluster got."""

from __future__ import annotations

import os
import time
import types

import pytest

from clusters import testing
from clusters.kind import waits as kind_waits


@pytest.fixture
def load(monkeypatch):
    """Set the load average the waits read (one, five and fifteen minutes) on 2 CPUs."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def set_load(one: float, five: float) -> None:
        monkeypatch.setattr(os, "getloadavg", lambda: (one, five, 1.0))
    return set_load


def _never_done(timeout: float) -> tuple[float, str]:
    started = time.monotonic()
    with pytest.raises(testing.ConditionTimeout) as failed:
        testing.eventually(lambda: "pending", lambda value: value == "done",
                           expected="done", timeout=timeout, interval=0.01)
    return time.monotonic() - started, str(failed.value)


def test_on_an_idle_machine_a_wait_ends_at_its_timeout(load):
    load(0.5, 1.5)  # 0.75 per CPU at most: idle
    elapsed, message = _never_done(0.3)
    assert 0.3 <= elapsed < 1.0, elapsed
    assert "within 0.3s (load average 0.5 / 1.5 / 1.0 on 2 CPUs)" in message, message
    assert "last seen: 'pending'" in message, message


def test_on_a_busy_machine_a_wait_lasts_as_much_longer_as_the_load_says(load):
    load(5.0, 3.0)  # 2.5 per CPU
    elapsed, message = _never_done(0.3)
    assert 0.75 <= elapsed < 1.5, elapsed
    assert "stretched from 0.3s" in message and "load average 5.0" in message, message


def test_the_stretch_is_at_most_four_times(load):
    load(40.0, 40.0)
    assert testing.load_stretch() == testing.MOST_STRETCH == 4.0
    assert testing.stretched(10) == 40


def test_a_wait_for_an_event_stretches_up_to_eight_times(load):
    # A load of 13-21 on two cores was seen with kind's modules in the other process: an
    # event that must come gets the machine's share of a core, at most 8 times the wait.
    load(12.0, 20.0)
    elapsed, message = _never_done(0.1)
    assert 0.8 <= elapsed < 1.5, elapsed
    assert "stretched from 0.1s" in message and "load average 12.0 / 20.0" in message, message
    load(6.0, 3.0)  # 3 per CPU
    assert testing.load_stretch(testing.MOST_WAIT_STRETCH) == 3.0


def test_a_deadline_moves_out_with_the_load_and_never_back_in(load):
    load(16.0, 16.0)  # 8 per CPU
    now = [100.0]
    deadline = testing.Deadline(0.1, clock=lambda: now[0])
    assert not deadline.passed()
    now[0] += 0.12
    assert not deadline.passed() and deadline.limit == pytest.approx(0.8)
    load(0.1, 0.1)  # the load gone: what was given stays given
    assert not deadline.passed() and deadline.limit == pytest.approx(0.8)
    now[0] += 0.7
    assert deadline.passed()
    assert ", stretched from 0.1s (load average 0.1 / 0.1" in deadline.waited(), \
        deadline.waited()


def test_a_wait_that_succeeds_returns_what_it_saw_at_once(load):
    load(40.0, 40.0)
    started = time.monotonic()
    assert testing.eventually(lambda: 3, lambda value: value == 3, expected="3") == 3
    assert time.monotonic() - started < 1.0


def test_holds_for_watches_a_longer_window_when_busy_if_asked_and_names_the_load(load):
    load(4.0, 2.0)  # 2 per CPU: twice the window
    started = time.monotonic()
    observations = testing.holds_for(lambda: 1, seconds=0.2, interval=0.02, stretch=True)
    assert time.monotonic() - started >= 0.4 and observations >= 10
    seen = iter([1, 1, 2])
    with pytest.raises(AssertionError) as failed:
        testing.holds_for(lambda: next(seen), lambda value: value == 1, seconds=5,
                          expected="one", interval=0.01)
    assert "observation 3" in str(failed.value) and "load average 4.0" in str(failed.value)
    # By default the window is what it says: it ends before the product's next step.
    started = time.monotonic()
    testing.holds_for(lambda: 1, seconds=0.2, interval=0.02)
    assert time.monotonic() - started < 0.4


@pytest.fixture
def kind_clock(monkeypatch):
    """The kind waits' clock, moved only by the test (so no scheduling delay decides which
    probe call is the last), and their sleeps, which take no time."""
    now = [0.0]
    monkeypatch.setattr(kind_waits, "time", types.SimpleNamespace(
        monotonic=lambda: now[0], sleep=lambda seconds: None))
    return now


def test_a_kind_wait_that_ends_on_an_error_also_says_how_far_the_cluster_got(kind_clock):
    answers = iter(["deployment x/y not rolled out (1 ready of 2)"])

    def probe():
        answer = next(answers, None)
        if answer is None:
            kind_clock[0] = 10.0  # past the deadline, on the call that fails
            raise TimeoutError("Read timed out. (read timeout=5.0)")
        return answer
    with pytest.raises(TimeoutError) as failed:
        kind_waits.wait_for("worker-1: the operator", probe, deadline=5.0)
    assert str(failed.value) == (
        "worker-1: the operator: still not ready at the deadline: TimeoutError: Read timed "
        "out. (read timeout=5.0); the last answer before that: deployment x/y not rolled "
        "out (1 ready of 2)"), failed.value


def test_a_kind_wait_that_ends_on_an_answer_gives_only_that_answer(kind_clock):
    kind_clock[0] = 10.0
    with pytest.raises(TimeoutError) as failed:
        kind_waits.wait_for("manager: Kueue", lambda: "webhook not answering", deadline=5.0)
    assert str(failed.value) == (
        "manager: Kueue: still not ready at the deadline: webhook not answering"), failed.value
