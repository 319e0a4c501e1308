"""Both modes speak one vocabulary of steps (dispatcher/actions.py): a step both have is
the same step, and ``release`` means the same to both performers."""

from __future__ import annotations

from dispatcher import actions
from dispatcher.kueue import decisions as kd
from dispatcher.standalone import decisions as d


def test_the_steps_both_modes_have_are_one_and_the_same():
    for shared in (actions.Action, actions.Ignore, actions.Forget):
        assert getattr(d, shared.__name__) is shared
        assert getattr(kd, shared.__name__) is shared
    mode_steps = [value for module in (d, kd) for value in vars(module).values()
                  if isinstance(value, type) and issubclass(value, actions.Action)]
    # Each mode's own steps are steps of the same kind.
    assert {"Place", "Wait", "Choose", "Nominate", "Release"} <= {s.__name__ for s in mode_steps}


def test_release_is_the_one_flag_either_performer_drops_held_room_by():
    # Kueue mode's Release is nothing but that flag; standalone steps raise it case by case.
    assert kd.Release(why="evicted").release is True
    assert kd.Forget(why="finished").release is False  # forgetting drops everything anyway
    assert d.Ignore(release=True, why="finished").release is True
    assert actions.Ignore().name == "Ignore" and kd.Release().name == "Release"
