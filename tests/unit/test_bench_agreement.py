"""``python -m bench.agreement``: two runs' latency figures side by side, judged within a
share, with what the host gave each run; and the host's speed before each repeat in the
table."""

from __future__ import annotations

import json

import pytest

from bench import agreement
from bench.report import _spread_rows


def _summary(p50: float, p90: float, p99: float) -> dict:
    return {"count": 1500, "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "max_ms": p99 * 2}


def _step(latency: dict, cpu_seconds: float, speeds: list[float]) -> dict:
    return {"cpu": {"cpu_seconds": {"manager apiserver+etcd": cpu_seconds * 0.75,
                                    "dispatcher": cpu_seconds * 0.25}},
            "runs": [{"settle": {"settled": True, "reference_ms": s}} for s in speeds],
            **latency}


def _results(tmp_path, name: str, *, sync_p99: float, sync_cpu: float = 30.0,
             speeds=(25.0, 26.0, 30.0), mode: str = "quick", **extra) -> str:
    steady = _step({"latency": _summary(10.0, 14.0, 20.0)}, 45.0, list(speeds))
    steady.update(rate=50, dispatched=1500)
    sync = _step({"lag": _summary(11.0, 15.0, sync_p99)}, sync_cpu, list(speeds))
    sync["synced"] = 1500
    results = {"mode": mode, "started": "2026-01-01T00:00:00+00:00",
               "settings": {"suite": "dispatcher"},
               "environment": {"reference_work_ms": {"start": 25.0, "end": 26.0}},
               "steady": [steady], "sync": sync, **extra}
    path = tmp_path / name
    path.mkdir()
    (path / "results.json").write_text(json.dumps(results))
    return str(path)


def test_figures_within_the_share_agree_and_the_exit_status_says_so(tmp_path, capsys):
    a = _results(tmp_path, "a", sync_p99=40.0)
    b = _results(tmp_path, "b", sync_p99=50.0)  # 25 % above a
    assert agreement.main([a, b]) == 0
    out = capsys.readouterr().out
    assert "| status sync lag p99 ms | 40 | 50 | 25% | yes |" in out, out
    assert "6 of 6 latency figures agree within 30%." in out, out


def test_a_figure_apart_is_named_and_measured_from_the_smaller(tmp_path, capsys):
    a = _results(tmp_path, "a", sync_p99=40.0)
    b = _results(tmp_path, "b", sync_p99=53.0, sync_cpu=39.0, speeds=(33.0, 34.0, 35.0))
    # 53 over 40 is 32.5 % apart (from the larger figure it would be 24.5 %).
    assert agreement.main([a, b]) == 1
    out = capsys.readouterr().out
    assert "| status sync lag p99 ms | 40 | 53 | 32% | NO |" in out, out
    assert "5 of 6 latency figures agree within 30%; see the NO rows" in out, out
    # What the host gave: the sync's CPU per status change (every group's seconds over
    # the 1,500 changes) and the median reference work before the repeats.
    assert "| status sync lag: machine CPU per unit of work, ms | 20 | 26 | 30% |" in out, out
    assert ("| status sync lag: host reference work before the repeats, median CPU ms | "
            "26 | 34 | 31% |") in out, out
    # Each figure beside how differently the host ran its step (the machine's CPU per unit
    # of work apart), and the figures counted again over the steps the host ran alike.
    assert "| status sync lag p99 ms | 40 | 53 | 32% | NO | 30% |" in out, out
    assert "| steady 50 jobs/s p99 ms | 20 | 20 | 0% | yes | 0% |" in out, out
    assert ("From the steps whose machine CPU per unit of work was within 10% (the host "
            "about as fast in both runs): 3 of 3 agree.") in out, out
    # Every step run at a different speed: said so, rather than "0 of 0 agree".
    c = _results(tmp_path, "c", sync_p99=53.0, sync_cpu=39.0)
    results = json.loads((tmp_path / "c" / "results.json").read_text())
    results["steady"][0]["cpu"]["cpu_seconds"]["dispatcher"] *= 2
    (tmp_path / "c" / "results.json").write_text(json.dumps(results))
    assert agreement.main([a, c]) == 1
    assert ("No step's machine CPU per unit of work was within 10% in both runs: the host "
            "ran every step at a different speed.") in capsys.readouterr().out
    assert agreement.main([a, b, "--host-within", "35"]) == 1
    assert "within 35% (the host about as fast in both runs): 5 of 6 agree." in \
        capsys.readouterr().out
    # A looser share accepts the same pair, and with every figure agreeing there is no
    # second count.
    assert agreement.main([a, b, "--within", "35%"]) == 0
    assert "From the steps" not in capsys.readouterr().out


def test_input_that_cannot_be_compared_is_refused_with_the_reason(tmp_path, capsys):
    good = _results(tmp_path, "good", sync_p99=40.0)
    cases = {
        str(tmp_path / "missing"): "no such file",
        _results(tmp_path, "cut", sync_p99=40.0, incomplete="interrupted"):
            "the run is incomplete (interrupted)",
        _results(tmp_path, "full", sync_p99=40.0, mode="full"):
            "run A is a quick run and run B a full run",
    }
    for other, reason in cases.items():
        assert agreement.main([good, other]) == 2, other
        err = capsys.readouterr().err
        assert reason in err, f"expected {reason!r} in {err!r}"
    compare_only = tmp_path / "compare.json"
    compare_only.write_text(json.dumps({"settings": {"suite": "compare"}, "mode": "quick"}))
    assert agreement.main([good, str(compare_only)]) == 2
    assert "has no dispatcher scenarios (suite 'compare')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agreement.main([good, good, "--within", "0"])


def test_the_table_shows_the_host_speed_before_each_repeat():
    summary = {"spread": {"p50_ms": {"min": 9.0, "median": 10.0, "max": 11.0},
                          "p99_ms": {"min": 20.0, "median": 25.0, "max": 41.0}}}
    runs = [{"settle": {"settled": True, "reference_ms": x}} for x in (25.4, 25.9, 41.0)]
    assert _spread_rows(summary, runs) == [
        "| | over the repeats, min / median / max ms | p50 9.0 / 10.0 / 11.0; "
        "p99 20.0 / 25.0 / 41.0 |",
        "| | host speed before each repeat: reference work CPU ms | 25.4 / 25.9 / 41.0 |"]
    # Results from before the host was timed per repeat: the spread row alone.
    assert len(_spread_rows(summary, [{"settle": {"settled": True}}])) == 1


def test_the_share_of_a_step_the_host_was_slow_is_compared_in_points(tmp_path, capsys):
    a = _results(tmp_path, "a", sync_p99=40.0)
    b = _results(tmp_path, "b", sync_p99=40.0)
    for path, share in ((a, 0.05), (b, 0.3)):
        results = json.loads((tmp_path / path / "results.json").read_text())
        results["sync"]["cpu"]["host_slow_share"] = share
        (tmp_path / path / "results.json").write_text(json.dumps(results))
    assert agreement.main([a, b]) == 0
    out = capsys.readouterr().out
    assert "| status sync lag: share of the repeats the host was slow | 5% | 30% | 25 points |" \
        in out, out
    # A run without the probe's readings: n/a, not zero.
    assert "| steady 50 jobs/s: share of the repeats the host was slow | n/a | n/a | n/a |" \
        in out, out


def test_the_table_shows_how_much_of_each_repeat_the_host_was_slow():
    summary = {"spread": {"p99_ms": {"min": 20.0, "median": 25.0, "max": 41.0}}}
    runs = [{"settle": {"reference_ms": 25.0}, "cpu": {"host_slow_share": x}}
            for x in (0.0, 0.354, 0.12)]
    assert _spread_rows(summary, runs)[-1] == (
        "| | host slow during each repeat (reference work over 1.3x its fastest) | "
        "0% / 35% / 12% |")
