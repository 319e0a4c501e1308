"""What a benchmark run does: the scale of each scenario, as a full and a quick preset."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class BenchSettings:
    burst_jobs: int = 1000            # jobs in the burst (and in each ceiling run)
    burst_workers: int = 3            # workers the burst, steady and sync scenarios use
    concurrency: int = 16             # client threads creating jobs (burst and ceiling alike)
    rates: tuple[int, ...] = (10, 50, 100)   # steady arrival rates, jobs/s
    rate_seconds: float = 20.0        # how long each steady rate is kept up, at least
    # ... and longer where that many arrivals take longer (10 jobs/s for 50 s): a repeat's
    # p99 is then its 5th largest sample and the step's over three repeats its 15th, where
    # 20 s at 10 jobs/s gave the 2nd of 200, which one slow answer moves by half.
    step_samples: int = 500
    sync_jobs: int = 500              # remote status changes in the sync scenario
    sync_rate: float = 50.0           # remote status writes per second
    fill_to: int = 10000              # mirrored jobs for the large footprint figure
    idle_seconds: float = 10.0        # length of an idle footprint window
    # Each steady step and the status sync run this many times, each after the machine
    # settled; their figures are the median over the repeats, with min and max beside.
    repeats: int = 3
    scaling_workers: tuple[int, ...] = (1, 2, 4, 8)
    scaling_jobs: int = 1000          # burst size per scaling step
    constrained_jobs: int = 60       # jobs of mixed sizes in the constrained-placement run
    # How long a constrained run may take; a dispatcher that strands jobs never finishes.
    constrained_timeout: float = 600.0
    # The side-by-side comparison with Kueue (on clusters of its own, burst_workers workers).
    compare_jobs: int = 1000          # jobs in each contender's burst
    compare_rates: tuple[int, ...] = (10, 50, 100)  # each contender's steady arrival rates
    compare_rate_seconds: float = 20.0
    # How long a step's deleted jobs may take to go, copies and Workloads included, before
    # what is left is cleared by force and every Kueue restarted (so that no contender's
    # backlog of deletions queues ahead of its next step's jobs).
    drain_timeout: float = 30.0
    contenders: tuple[str, ...] = ("A", "B", "C", "D")
    # Worker counts the comparison runs at in turn, each on clusters of its own (empty: once,
    # at burst_workers): how each contender's cost per job grows with the workers.
    workers_axis: tuple[int, ...] = ()
    # What the comparison runs for each contender: its burst, its steady steps, its
    # constrained-placement run (the create ceiling goes with the burst).
    compare_scenarios: tuple[str, ...] = ("burst", "steady", "constrained")
    # The kinds the comparison's constrained jobs are submitted as, in turn (see
    # bench.constrained.workload): TrainJobs only, or a mix with batch/v1 Jobs of the
    # same pods, which every contender must queue through Kueue.
    constrained_kinds: tuple[str, ...] = ("trainjob",)
    # Which parts run: "dispatcher" (the scenarios of this dispatcher alone), "compare"
    # (the comparison) or "all".
    suite: str = "all"
    placement_policy: str = "worst-fit"
    profile: bool = False             # py-spy the dispatcher during the burst and the fill
    # Extra flags for every dispatcher the run starts (e.g. ("--workers", "16")).
    dispatcher_args: tuple[str, ...] = ()
    # The scale suite (bench.scale): workers the size of real GPU clusters.
    scale_workers: int = 2
    scale_nodes: int = 1000           # kwok Nodes per worker at the full size
    scale_pods: int = 20000           # Pods per worker at the full size (3 daemons a Node)
    # Smaller sizes measured first, (Nodes, Pods) per worker: the growth axis.
    scale_axis: tuple[tuple[int, int], ...] = ((10, 200), (100, 2000))
    scale_placement_jobs: int = 100   # jobs of each shape (small, wide, GPU) timed
    scale_churn_rate: float = 50.0    # Pods replaced per second on each worker
    scale_rates: tuple[int, ...] = (10, 50)  # arrival rates measured during the churn
    scale_rate_seconds: float = 20.0
    scale_window_seconds: float = 20.0       # the idle and the churn CPU windows
    scale_create_threads: int = 32    # client threads creating the fleet
    # The log-streams suite (bench.log_streams): the steady arrival rate timed plain and
    # with this many users following a job's log through the remote view, each log given
    # this many lines a second.
    log_streams: int = 50
    log_streams_rate: int = 50
    log_lines_per_second: float = 10.0

    @property
    def harness_workers(self) -> int:
        return max(self.burst_workers, *self.scaling_workers)

    def as_dict(self) -> dict:
        return asdict(self)


FULL = BenchSettings()
# Quick runs keep 500 samples in the burst, each sync repeat and each steady repeat (the
# 10 jobs/s one lasts 50 s for it), so that a p99 is the 5th largest sample and not the
# largest: one stall does not decide it. The repeats alone take the mirrored count past 3,000.
QUICK = BenchSettings(burst_jobs=500, rates=(10, 50), rate_seconds=10.0, sync_jobs=500,
                      fill_to=2000, idle_seconds=3.0, scaling_workers=(1, 2, 4),
                      scaling_jobs=100, constrained_jobs=24, compare_jobs=40,
                      constrained_timeout=120.0, compare_rates=(10,), compare_rate_seconds=3.0,
                      scale_axis=(), scale_placement_jobs=30, scale_rate_seconds=10.0,
                      scale_window_seconds=8.0)


def preset(quick: bool, **overrides) -> BenchSettings:
    base = QUICK if quick else FULL
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
