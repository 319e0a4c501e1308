"""``python -m bench.agreement RUN_A RUN_B``: do two benchmark runs' latency figures agree?

A benchmark figure means something only if running it again gives about the same number.
This compares two runs' ``results.json`` (each a directory or the file): every latency
percentile of the steady steps and of the status sync, how far apart each pair is
(the larger over the smaller, so 30 % means one is 1.3 times the other), and whether that
is within ``--within``. Beside them it sets what the host gave each run, since a shared
host can take three quarters longer over the same work for seconds at a time:

- the reference work's CPU time (``bench.host_speed``) at each run's start and end and,
  where the run recorded it, before each repeat;
- the machine's CPU per unit of work in each step (every process group's CPU seconds over
  the jobs dispatched or statuses copied): the same work costing more CPU in one run
  means a slower host, or a busier one, in that run;
- the share of each step the host was slow, from the probe that times a slice of the
  reference work twice a second, and the probe's median time per read at random places
  of a buffer the shared cache should hold (``bench.host_speed``).

Exit status 0 when every latency figure agrees, 1 when one does not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.repeats import host_speeds

PERCENTILES = ("p50_ms", "p90_ms", "p99_ms")
DEFAULT_WITHIN = 0.30
# Two steps had about the same host when the machine's CPU per unit of work is this close.
DEFAULT_HOST_WITHIN = 0.10


class RunError(ValueError):
    """A results file that cannot be compared; the message names it and why."""


@dataclass(frozen=True)
class Pair:
    figure: str
    a: float | None
    b: float | None
    share: bool = False  # a and b are shares (0-1): shown as percentages, apart in points
    step: str = ""  # the step a latency figure is from

    @property
    def apart(self) -> float | None:
        """How far apart, as the larger over the smaller less one (shares: the difference);
        None if either is missing (or, not a share, zero)."""
        if self.share:
            return None if self.a is None or self.b is None else abs(self.a - self.b)
        if not self.a or not self.b:
            return None
        return max(self.a, self.b) / min(self.a, self.b) - 1


def load(path: Path) -> dict:
    """A complete run's results; ``path`` a results directory or its results.json."""
    file = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(file.read_text())
    except FileNotFoundError:
        raise RunError(f"{file}: no such file (expected a benchmark's --output directory "
                       "or its results.json)") from None
    except json.JSONDecodeError as err:
        raise RunError(f"{file}: not JSON ({err})") from None
    if not isinstance(results, dict) or "settings" not in results:
        raise RunError(f"{file}: not a benchmark's results (no 'settings')")
    if results.get("incomplete"):
        raise RunError(f"{file}: the run is incomplete ({results['incomplete']})")
    if "sync" not in results or "steady" not in results:
        raise RunError(f"{file}: the run has no dispatcher scenarios (suite "
                       f"{results['settings'].get('suite')!r}); run with --suite dispatcher "
                       "or all")
    return results


def steps(results: dict) -> dict[str, tuple[dict, dict, int]]:
    """Each step by name: (its percentiles, the step, its units of work)."""
    named = {f"steady {s['rate']} jobs/s": (s["latency"], s, s["dispatched"])
             for s in results["steady"]}
    sync = results["sync"]
    named["status sync lag"] = (sync["lag"], sync, sync["synced"])
    return named


def latency_pairs(a: dict, b: dict) -> list[Pair]:
    """The latency percentiles of the steps both runs have, in the first run's order."""
    steps_a, steps_b = steps(a), steps(b)
    return [Pair(f"{name} {p[:-3]} ms", steps_a[name][0].get(p), steps_b[name][0].get(p),
                 step=name)
            for name in steps_a if name in steps_b for p in PERCENTILES]


def cpu_pairs(a: dict, b: dict) -> dict[str, Pair]:
    """By step both runs have: the machine's CPU per unit of work in each run. The work per
    unit is the same, so how far apart they are is how differently the host ran them."""
    steps_a, steps_b = steps(a), steps(b)
    return {name: Pair(f"{name}: machine CPU per unit of work, ms",
                       cpu_per_unit_ms(steps_a[name][1], steps_a[name][2]),
                       cpu_per_unit_ms(steps_b[name][1], steps_b[name][2]))
            for name in steps_a if name in steps_b}


def cpu_per_unit_ms(step: dict, units: int) -> float | None:
    """The machine's CPU (every process group) per job or status change, ms."""
    cpu = step.get("cpu")
    if not cpu or not units:
        return None
    return round(sum(cpu["cpu_seconds"].values()) / units * 1000, 1)


def host_pairs(a: dict, b: dict, cpu: dict[str, Pair]) -> list[Pair]:
    """What the host gave each run: the reference work at start and end, its median over
    a step's repeats, and the machine's CPU per unit of work in each step."""
    ref_a = a.get("environment", {}).get("reference_work_ms") or {}
    ref_b = b.get("environment", {}).get("reference_work_ms") or {}
    pairs = [Pair(f"host reference work at the run's {when}, CPU ms", ref_a.get(when),
                  ref_b.get(when)) for when in ("start", "end")]
    steps_a, steps_b = steps(a), steps(b)
    for name, per_unit in cpu.items():
        step_a, step_b = steps_a[name][1], steps_b[name][1]
        pairs.append(Pair(f"{name}: host reference work before the repeats, median CPU ms",
                          _median_reference(step_a), _median_reference(step_b)))
        pairs.append(per_unit)
        pairs.append(Pair(f"{name}: share of the repeats the host was slow",
                          (step_a.get("cpu") or {}).get("host_slow_share"),
                          (step_b.get("cpu") or {}).get("host_slow_share"), share=True))
        pairs.append(Pair(f"{name}: host cache read at random, median ns",
                          (step_a.get("cpu") or {}).get("host_cache_read_ns"),
                          (step_b.get("cpu") or {}).get("host_cache_read_ns")))
    return pairs


def _median_reference(step: dict) -> float | None:
    speeds = host_speeds(step.get("runs", []))
    return round(statistics.median(speeds), 2) if speeds else None


def _cell(value: float | None, share: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0%}" if share else f"{value:g}"


def _apart(pair: Pair) -> str:
    if pair.apart is None:
        return "n/a"
    return f"{pair.apart * 100:.0f} points" if pair.share else f"{pair.apart:.0%}"


def render(a: dict, b: dict, names: tuple[str, str], within: float,
           host_within: float = DEFAULT_HOST_WITHIN) -> tuple[str, bool]:
    """The comparison as Markdown, and whether every latency figure agrees."""
    latency = latency_pairs(a, b)
    agreeing = [p for p in latency if p.apart is not None and p.apart <= within]
    cpu = cpu_pairs(a, b)
    lines = [f"Run A: {names[0]} ({a.get('mode')}, started {a.get('started')})",
             f"Run B: {names[1]} ({b.get('mode')}, started {b.get('started')})", "",
             f"| latency figure | A | B | apart | within {within:.0%} | the step's machine CPU "
             "per unit apart |",
             "|---|---|---|---|---|---|"]
    for pair in latency:
        met = "n/a" if pair.apart is None else ("yes" if pair.apart <= within else "NO")
        lines.append(f"| {pair.figure} | {_cell(pair.a)} | {_cell(pair.b)} | "
                     f"{_apart(pair)} | {met} | {_apart(cpu[pair.step])} |")
    lines += ["", "| what the host gave | A | B | apart |", "|---|---|---|---|"]
    lines += [f"| {p.figure} | {_cell(p.a, p.share)} | {_cell(p.b, p.share)} | {_apart(p)} |"
              for p in host_pairs(a, b, cpu)]
    every = bool(latency) and len(agreeing) == len(latency)
    lines += ["", f"{len(agreeing)} of {len(latency)} latency figures agree within "
              f"{within:.0%}" + ("." if every else "; see the NO rows, and read them with "
                                 "what the host gave each run.")]
    same_host = [p for p in latency
                 if cpu[p.step].apart is not None and cpu[p.step].apart <= host_within]
    if not every and not same_host:
        lines.append(f"No step's machine CPU per unit of work was within {host_within:.0%} "
                     "in both runs: the host ran every step at a different speed.")
    elif not every:
        held = [p for p in same_host if p in agreeing]
        lines.append(f"From the steps whose machine CPU per unit of work was within "
                     f"{host_within:.0%} (the host about as fast in both runs): {len(held)} "
                     f"of {len(same_host)} agree.")
    return "\n".join(lines), every


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.agreement",
        description="Compare two benchmark runs' latency figures (the steady steps' and the "
        "status sync's p50, p90 and p99) and say whether each pair agrees within a share, "
        "beside what the host gave each run (reference work, CPU per unit of work, the share "
        "of each step the host was slow). "
        "Exit status: 0 every figure agrees, 1 one does not, 2 bad input.")
    parser.add_argument("runs", nargs=2, type=Path, metavar="RUN",
                        help="a benchmark's --output directory, or its results.json")
    parser.add_argument("--within", type=_share, default=DEFAULT_WITHIN, metavar="PERCENT",
                        help="how far apart two figures may be and still agree, as the "
                        "larger over the smaller (default 30)")
    parser.add_argument("--host-within", type=_share, default=DEFAULT_HOST_WITHIN,
                        metavar="PERCENT",
                        help="how close a step's machine CPU per unit of work must be in both "
                        "runs for the host to count as equally fast: the last line counts "
                        "the figures of those steps apart (default 10; the exit status does "
                        "not change)")
    return parser


def _share(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a percentage above 0, got {text!r}")
    return value / 100


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        a, b = (load(path) for path in args.runs)
    except RunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.get("mode") != b.get("mode"):
        print(f"error: run A is a {a.get('mode')} run and run B a {b.get('mode')} run; "
              "their steps differ in length and rate, so compare runs of one mode",
              file=sys.stderr)
        return 2
    table, every = render(a, b, (str(args.runs[0]), str(args.runs[1])), args.within,
                          args.host_within)
    print(table)
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())
