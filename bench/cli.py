"""``python -m bench``: benchmark the dispatcher on local clusters and report the figures."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import sys
from pathlib import Path

from bench import log_streams, scale_report
from bench.compare import refused_contenders
from bench.contenders import CONTENDERS
from bench.environment import ControllerStartError
from bench.plot import write_plots
from bench.report import render_table
from bench.run import run_benchmark
from bench.settings import FULL, preset

DESCRIPTION = """\
Benchmark the dispatcher on the local harness: a manager and up to 8 worker clusters
(etcd + kube-apiserver + kube-controller-manager each) as processes on 127.0.0.1, the
dispatcher as its own process. No operator runs: a job is dispatched when its remote copy
exists on a worker.

Scenarios, in this order:
  ceiling   a plain client creates TrainJobs on the manager and on a worker (same count
            and concurrency as the burst); the dispatcher's throughput is reported as a
            share of the lower of the two
  constrained  60 jobs of mixed sizes (a quarter with GPUs) on workers of different
            sizes that hold them in aggregate but not each: they run to Complete (training
            operators, JobSet, scheduler, kwok; each trainer after its initializers, as
            upstream Trainer's runtimes order them); pods stuck unschedulable, copies
            withdrawn, makespan and mean Node utilisation
  scaling   burst throughput with 1, 2, 4 and 8 workers (a fresh dispatcher each)
  burst     1,000 jobs created on the manager at once, 3 workers: throughput (first create
            to last remote seen), latency per job (manager TrainJob ADDED to remote ADDED,
            both from the benchmark's own watches), API requests per job (apiservers' own
            apiserver_request_total), dispatcher RSS and CPU from /proc
  sync      remote status written as the operator would; lag until the manager shows it,
            and manager writes per change
  steady    arrivals at 10, 50 and 100 jobs/s for 20 s each, or as long as 500 arrivals
            take (--step-samples): latency percentiles
  fill      up to 10,000 mirrored jobs: dispatcher RSS and CPU under the burst and idle
  compare   on clusters of their own where the manager and every worker run Kueue, the
            same jobs and load under A Kueue MultiKueue AllAtOnce, B Kueue Incremental,
            C Kueue with this dispatcher as its external dispatcher (--mode kueue) and
            D this dispatcher standalone: a burst (throughput, latency to the copy and to
            all of a job's pods Running on kwok, API cost, CPU of every controller,
            Kueue's included), steady arrival and constrained placement; a step's jobs
            are deleted before the next (--drain-timeout); --compare-scenarios picks among
            burst, steady and constrained; --constrained-kinds trainjob,batch-job makes the
            comparison's constrained jobs a mix of TrainJobs and batch/v1 Jobs (A, B, C)
  scale     (--suite scale only) 2 workers of 1,000 kwok Nodes (a tenth GPU Nodes) and
            20,000 Pods each, bound and Running, after smaller sizes: the dispatcher's
            RSS per Node and per Pod, start to caches synced, a standby taking over,
            one placement decision (small, wide, GPU jobs; the first of each apart),
            dispatch latency and CPU while each worker's Pods churn, beside the floor:
            the same writes per job at the same rates by a plain client with no
            placement and no caches; a Pod event's time to its room counted (the
            dispatcher's dispatcher_capacity_event_apply_seconds); budgets met or missed
  log-streams  (--suite log-streams only) steady arrival at 50 jobs/s on 3 workers,
            plain and with 50 users following logs (follow=true) through the remote
            view, the manager's aggregation layer to the dispatcher, alternately, 3 runs
            each way: dispatch p50/p99 both ways and their ratio, the dispatcher's CPU
            per job, the streams' bytes and lines, streams refused (429)
The sync and each steady step run 3 times (--repeats), each after the machine settled (no
Event left for the dispatcher to write, the machine's CPU under 35% busy over a second);
a percentile is over all the repeats' samples, shown with each repeat's min, median and
max, and with the host's speed before each repeat (a fixed piece of CPU work, timed). The
idle windows also wait for the machine to settle. Whether two runs agree:
python -m bench.agreement RUN_A RUN_B; how much of several runs' differences follows the
host's speed: python -m bench.host_effect RUN RUN RUN ...; two commits run alternately on
the same machine, each figure side by side with the ratio: python -m bench --compare-commits
A B (python -m bench.commits --help).
Every target is printed with the measured value and whether it was met. A run that stops
early (a controller that does not start, Ctrl-C) still writes results.json, marked
incomplete; a controller that does not start is named with its log file.

Output (--output): results.json (every figure, the environment, the dispatcher's
configuration), table.md, latency.png, scaling.png, comparison.png, logs/. This
dispatcher's scenarios take 5-10 minutes on two cores; the comparison as long again and
more (Kueue's own dispatchers are slow at 1,000 jobs). --quick (a 500-job burst, 500 status
changes, rates 10 and 50 for 10 s or 500 arrivals, so a repeat's p99 in each steady step
and in the sync is the 5th largest of 500 samples; 1, 2, 4 workers; 40 jobs and 10 jobs/s
per contender) takes minutes. The clusters and processes are removed at the end, Ctrl-C included.
"""

def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


COMPARE_SCENARIOS = ("burst", "steady", "constrained")
JOB_KINDS = ("trainjob", "batch-job")  # = bench.constrained.KINDS


def _choices(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(x.strip().lower() for x in text.split(",") if x.strip())
        if not values or set(values) - set(allowed) or len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(
                f"expected some of {','.join(allowed)}, comma-separated, each once; got "
                f"{text!r}")
        return values
    return parse


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        sizes = tuple(tuple(int(x) for x in part.split(":")) for part in text.split(",")
                      if part.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected NODES:PODS,..., got {text!r}") from err
    if any(len(s) != 2 or min(s) < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected NODES:PODS,... of positive integers, "
                                         f"got {text!r}")
    return sizes


def _contenders(text: str) -> tuple[str, ...]:
    values = tuple(x.strip().upper() for x in text.split(",") if x.strip())
    if not values or set(values) - {"A", "B", "C", "D"}:
        raise argparse.ArgumentTypeError(f"expected some of A,B,C,D, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small numbers: a run of a few minutes")
    parser.add_argument("--output", type=Path, default=Path("bench-results"),
                        help="directory for results.json, table.md, the plots and logs "
                        "(default: %(default)s)")
    parser.add_argument("--state-dir", type=Path,
                        help="use clusters already running under this harness state "
                        "directory (python -m clusters up --workers N) and leave them running;"
                        " default: start fresh ones and remove them at the end; the comparison "
                        "always starts clusters of its own, with Kueue")
    scale = parser.add_argument_group("scale (override the preset)")
    scale.add_argument("--jobs", type=int, dest="burst_jobs",
                       help=f"jobs in the burst and each ceiling run (full {FULL.burst_jobs})")
    scale.add_argument("--burst-workers", type=int,
                       help=f"workers for burst, steady and sync (full {FULL.burst_workers})")
    scale.add_argument("--concurrency", type=int,
                       help=f"client threads creating jobs (full {FULL.concurrency})")
    scale.add_argument("--rates", type=_ints,
                       help="steady arrival rates in jobs/s, comma-separated (full "
                       f"{','.join(map(str, FULL.rates))})")
    scale.add_argument("--rate-seconds", type=float,
                       help="seconds each steady rate lasts at least (full "
                       f"{FULL.rate_seconds:g})")
    scale.add_argument("--step-samples", type=int,
                       help="arrivals each steady repeat collects at least; a low rate lasts "
                       f"longer than --rate-seconds for them (full and quick {FULL.step_samples})")
    scale.add_argument("--sync-jobs", type=int,
                       help=f"remote status changes timed (full {FULL.sync_jobs})")
    scale.add_argument("--sync-rate", type=float,
                       help=f"remote status writes per second (full {FULL.sync_rate:g})")
    scale.add_argument("--fill-to", type=int,
                       help=f"mirrored jobs for the large footprint figure (full {FULL.fill_to})")
    scale.add_argument("--repeats", type=int,
                       help="times the sync and each steady step run, each after the "
                       f"machine settled (full and quick {FULL.repeats})")
    scale.add_argument("--idle-seconds", type=float,
                       help=f"length of an idle footprint window (full {FULL.idle_seconds:g})")
    scale.add_argument("--scaling-workers", type=_ints,
                       help="worker counts for the scaling scenario (full "
                       f"{','.join(map(str, FULL.scaling_workers))})")
    scale.add_argument("--scaling-jobs", type=int,
                       help=f"burst size per scaling step (full {FULL.scaling_jobs})")
    scale.add_argument("--constrained-jobs", type=int,
                       help="jobs of mixed sizes in the constrained-placement run (full "
                       f"{FULL.constrained_jobs})")
    scale.add_argument("--constrained-timeout", type=float,
                       help="seconds a constrained-placement run may take before its "
                       f"unfinished jobs are reported (full {FULL.constrained_timeout:g})")
    compare = parser.add_argument_group(
        "comparison with Kueue MultiKueue (A AllAtOnce, B Incremental, C Kueue with this "
        "dispatcher as its external dispatcher, D this dispatcher standalone)")
    compare.add_argument("--suite", choices=("all", "dispatcher", "compare", "scale",
                                              "log-streams"),
                         help="what runs: this dispatcher's scenarios, the comparison, or "
                         "both (default); or the scale suite alone (workers the size of "
                         "real GPU clusters; not part of all); or the log-streams suite "
                         "alone (not part of all)")
    compare.add_argument("--contenders", type=_contenders,
                         help="which of A,B,C,D the comparison runs (default all four)")
    compare.add_argument("--compare-scenarios", type=_choices(COMPARE_SCENARIOS),
                         metavar="LIST",
                         help="which of burst (with the create ceiling), steady and "
                         "constrained each contender runs, comma-separated (default all "
                         "three)")
    compare.add_argument(
        "--constrained-kinds", type=_choices(JOB_KINDS), metavar="KINDS",
        help="what the comparison's constrained jobs are submitted as, in turn: "
        "'trainjob' (the default), or 'trainjob,batch-job' for a mix in which every other "
        "job (the GPU jobs alternating too) is a batch/v1 Job with the same pods (count, "
        "requests, run time, no initializers), queued to Kueue's LocalQueue like the "
        "TrainJobs; every Kueue then runs its batch/job integration too, and the figures "
        "are given for the mix and per kind. Only contenders behind Kueue (A, B, C) take "
        "batch Jobs: D, this dispatcher standalone, dispatches TrainJobs only and is "
        "refused (choose --contenders among A,B,C). This dispatcher's own constrained "
        "scenario (--suite all/dispatcher, standalone) keeps TrainJobs")
    compare.add_argument("--workers-axis", type=_ints, metavar="COUNTS",
                         help="run the comparison once per worker count, comma-separated "
                         "(e.g. 2,4,8), each on fresh clusters with the same jobs, instead "
                         "of once at --burst-workers; the report adds a table per count, "
                         "the ratios D/A and C/A per count and workers-axis.png")
    compare.add_argument("--compare-jobs", type=int,
                         help=f"jobs in each contender's burst (full {FULL.compare_jobs})")
    compare.add_argument("--compare-rates", type=_ints,
                         help="each contender's steady arrival rates in jobs/s (full "
                         f"{','.join(map(str, FULL.compare_rates))})")
    compare.add_argument("--compare-rate-seconds", type=float,
                         help="seconds each of those rates lasts (full "
                         f"{FULL.compare_rate_seconds:g})")
    compare.add_argument("--drain-timeout", type=float,
                         help="seconds a step's jobs may take to go after they are deleted, "
                         "as a user would, before what is left is deleted directly and "
                         "every Kueue restarted, so the next step starts with no backlog; "
                         "0: every step cleared so, without waiting "
                         f"(default {FULL.drain_timeout:g})")
    sized = parser.add_argument_group(
        "scale suite (--suite scale): workers of kwok Nodes of mixed sizes (a tenth GPU "
        "Nodes) and Pods bound to them; the dispatcher's memory, start, placement decisions, "
        "a standby taking over, and dispatch latency while the Pods churn")
    sized.add_argument("--scale-workers", type=int,
                       help=f"workers (full and quick {FULL.scale_workers})")
    sized.add_argument("--scale-nodes", type=int,
                       help=f"Nodes per worker at the full size (full and quick "
                       f"{FULL.scale_nodes})")
    sized.add_argument("--scale-pods", type=int,
                       help="Pods per worker at the full size, three daemon Pods a Node "
                       f"among them (full and quick {FULL.scale_pods})")
    sized.add_argument("--scale-axis", type=_sizes, metavar="NODES:PODS,...",
                       help="smaller sizes measured first, per worker (full "
                       + ",".join(f"{n}:{p}" for n, p in FULL.scale_axis)
                       + "; quick none; 'none' for none)")
    sized.add_argument("--scale-placement-jobs", type=int,
                       help="jobs of each shape (small, wide, GPU) whose placement is timed "
                       f"(full {FULL.scale_placement_jobs}, quick 30)")
    sized.add_argument("--scale-churn-rate", type=float,
                       help="Pods deleted and replaced per second on each worker (full and "
                       f"quick {FULL.scale_churn_rate:g})")
    sized.add_argument("--scale-rates", type=_ints,
                       help="arrival rates (jobs/s) timed during the churn, each for the "
                       "dispatcher and then for the floor (full and quick "
                       f"{','.join(map(str, FULL.scale_rates))})")
    sized.add_argument("--scale-rate-seconds", type=float,
                       help=f"seconds each of those rates lasts (full {FULL.scale_rate_seconds:g}"
                       ", quick 10)")
    sized.add_argument("--scale-window-seconds", type=float,
                       help="length of the idle and the churn CPU windows (full "
                       f"{FULL.scale_window_seconds:g}, quick 8)")
    sized.add_argument("--scale-create-threads", type=int,
                       help=f"client threads creating the fleet (full {FULL.scale_create_threads})")
    streams = parser.add_argument_group(
        "log-streams suite (--suite log-streams): dispatch latency and the dispatcher's CPU "
        "per job at one arrival rate, plain and with users following logs through the "
        "remote view (the aggregated API), alternately, --repeats times each way; "
        "--burst-workers workers, each run --rate-seconds long (or --step-samples "
        "arrivals); the bound is the dispatcher's --remote-api-max-streams (default 50; "
        "another with --dispatcher-args)")
    streams.add_argument("--log-streams", type=int,
                         help=f"log streams following (full and quick {FULL.log_streams})")
    streams.add_argument("--log-streams-rate", type=int,
                         help="arrival rate in jobs/s (full and quick "
                         f"{FULL.log_streams_rate})")
    streams.add_argument("--log-lines-per-second", type=float,
                         help="lines a second added to each followed log (every stream "
                         f"receives each; full and quick {FULL.log_lines_per_second:g})")
    parser.add_argument("--placement-policy", choices=("best-fit", "worst-fit", "first-fit"),
                        help="the dispatcher's placement policy (default worst-fit: with "
                        "ample capacity best fit puts every job on one worker, which would "
                        "make the worker count irrelevant)")
    parser.add_argument("--profile", action="store_true", default=None,
                        help="record the dispatcher with py-spy during the burst and the "
                        "fill (profile-burst.svg, profile-fill.svg), the steady steps and "
                        "the status sync (collapsed stacks, on-CPU with the GIL and wall "
                        "clock: profile-steady-50-gil.txt, profile-sync-wall.txt, ...), and "
                        "during the comparison's bursts of C and D (profile-compare-C.svg, "
                        "...). Figures of a profiled run include the profiler's cost")
    parser.add_argument("--dispatcher-args", type=lambda text: tuple(shlex.split(text)),
                        metavar="FLAGS",
                        help="extra flags for every dispatcher the run starts, as one "
                        "string (e.g. \"--workers 16\"); its 'run --help' lists them")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    return parser


def _check_mix(settings) -> None:
    """Refuse, before any cluster starts, a constrained mix that cannot run as asked."""
    if settings.constrained_kinds == ("trainjob",):
        return
    kinds = ",".join(settings.constrained_kinds)
    if settings.suite == "dispatcher" or "constrained" not in settings.compare_scenarios:
        build_parser().error(
            f"--constrained-kinds {kinds}: only the comparison's constrained run takes a "
            "mix of kinds, and this run has none (use --suite compare or all, with "
            "constrained among --compare-scenarios)")
    refused = refused_contenders(settings)
    if refused:
        build_parser().error(
            f"--constrained-kinds {kinds}: " + "; ".join(refused.values())
            + ": a batch Job given managedBy kueue.x-k8s.io/multikueue would wait on the "
            "manager forever, as the manager runs no job controller and nothing would copy "
            "it; choose --contenders among "
            + ",".join(k for k in CONTENDERS if k not in refused))


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds through every cleanup and writes what was measured, like Ctrl-C."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--compare-commits"]:
        from bench import commits  # a run of its own per commit, in worktrees
        return commits.main(argv[1:])
    args = build_parser().parse_args(argv)
    # The harness runs each Go server on half the cores (clusters.processes), to spare a
    # machine shared by a dozen of them; a benchmark measures how fast the apiservers take
    # writes, so they get every core, as Go's default gives them.
    os.environ.setdefault("GOMAXPROCS", str(os.cpu_count() or 1))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    settings = preset(args.quick, **{k: getattr(args, k) for k in (
        "burst_jobs", "burst_workers", "concurrency", "rates", "rate_seconds", "step_samples",
        "sync_jobs",
        "sync_rate", "fill_to", "idle_seconds", "repeats", "scaling_workers", "scaling_jobs",
        "constrained_jobs", "constrained_timeout", "placement_policy", "profile", "suite",
        "contenders",
        "compare_jobs", "compare_rates", "compare_rate_seconds", "drain_timeout",
        "dispatcher_args", "compare_scenarios", "constrained_kinds", "workers_axis",
        "scale_workers", "scale_nodes", "scale_pods", "scale_axis", "scale_placement_jobs",
        "scale_churn_rate", "scale_rates", "scale_rate_seconds", "scale_window_seconds",
        "scale_create_threads", "log_streams", "log_streams_rate",
        "log_lines_per_second")})
    _check_mix(settings)
    signal.signal(signal.SIGTERM, _terminate)
    output = args.output.resolve()
    results: dict = {}
    try:
        run_benchmark(settings, output, args.state_dir,
                      mode="quick" if args.quick else "full", results=results)
    except KeyboardInterrupt as err:
        signum, reason = ((signal.SIGTERM, "terminated (SIGTERM)") if isinstance(err, Terminated)
                          else (signal.SIGINT, "interrupted"))
        _write_partial(output, results, reason)
        print(f"{reason}; clusters and processes stopped; what was measured is in "
              f"{output / 'results.json'} (marked incomplete)", file=sys.stderr)
        return 128 + signum
    except ControllerStartError as err:
        _write_partial(output, results, str(err))
        print(f"error: {err}; what was measured is in {output / 'results.json'} (marked "
              "incomplete)", file=sys.stderr)
        return 1
    except Exception as err:
        _write_partial(output, results, f"{type(err).__name__}: {err}")
        raise
    (output / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if settings.suite == "scale":
        table, plots = scale_report.render(results), scale_report.write_plots(results, output)
    elif settings.suite == "log-streams":
        table, plots = log_streams.render(results), []
    else:
        table, plots = render_table(results), write_plots(results, output)
    (output / "table.md").write_text(table + "\n")
    print(table)
    print(f"\nresults: {output / 'results.json'}"
          + ("; plots: " + ", ".join(str(p) for p in plots) if plots else ""))
    return 0


def _write_partial(output: Path, results: dict, reason: str) -> None:
    """What a run that stopped early measured, marked incomplete with the reason."""
    output.mkdir(parents=True, exist_ok=True)
    results["incomplete"] = reason
    (output / "results.json").write_text(json.dumps(results, indent=2) + "\n")
