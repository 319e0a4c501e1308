"""The waiting line (pure): jobs that wait for room get it highest priority first, then
oldest; a job behind may take room only on workers that no job ahead of it could use; a
job held back is looked at again when what held it leaves. Priorities are the values of
the manager's PriorityClasses their pod templates name."""

from __future__ import annotations

from decimal import Decimal as D

from dispatcher.placement.placer import Placer
from dispatcher.placement.priority import PriorityClasses
from dispatcher.placement.waiting_line import WaitingLine, job_of, rank_of
from dispatcher.room.capacity import WorkerCapacity
from dispatcher.standalone.waiting_order import PlacementOrder
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c

from worker_fakes import Cache, Registry

T0, T1, T2 = "2025-01-01T00:00:00Z", "2025-01-01T00:00:01Z", "2025-01-01T00:00:02Z"


def key(name: str) -> tuple[str, str]:
    return ("ns", name)


# --- the line ------------------------------------------------------------------------

def test_order_is_priority_then_age_then_name():
    line = WaitingLine()
    line.join(key("old-low"), rank_of(0, T0, key("old-low")), frozenset({"w1"}))
    line.join(key("young-high"), rank_of(100, T2, key("young-high")), frozenset({"w1"}))
    line.join(key("b-high"), rank_of(100, T1, key("b-high")), frozenset())
    line.join(key("a-high"), rank_of(100, T1, key("a-high")), frozenset(), "high")
    line.join(key("negative"), rank_of(-5, T0, key("negative")), frozenset({"w2"}))
    assert [(w.position, w.key[1], w.priority) for w in line.order()] == [
        (1, "a-high", 100), (2, "b-high", 100), (3, "young-high", 100), (4, "old-low", 0),
        (5, "negative", -5)]
    assert line.order()[0].priority_class == "high"
    assert line.keys()[0] == key("a-high")


def test_a_job_is_held_only_where_one_ahead_of_it_could_use_the_room():
    line = WaitingLine()
    line.join(key("high"), rank_of(100, T1, key("high")), frozenset({"w1"}))
    line.join(key("low"), rank_of(0, T0, key("low")), frozenset({"w1", "w2"}))
    # A low job (older, but lower) may not take w1's room; w2 is free for it.
    ahead = line.ahead_on(key("low"), rank_of(0, T0, key("low")))
    assert {worker: job_of(rank) for worker, rank in ahead.items()} == {"w1": key("high")}
    # The high job has nobody ahead of it anywhere, nor has an even higher newcomer.
    assert line.ahead_on(key("high"), rank_of(100, T1, key("high"))) == {}
    assert line.ahead_on(key("new"), rank_of(200, T2, key("new"))) == {}
    # A newcomer of equal priority is younger: it stands behind "high" on w1 and behind
    # "low" nowhere (lower priority).
    assert set(line.ahead_on(key("new"), rank_of(100, T2, key("new")))) == {"w1"}
    # A newcomer below both waits behind each where it could go.
    assert {w: job_of(r) for w, r in line.ahead_on(key("new"), rank_of(-1, T0, key("new")))
            .items()} == {"w1": key("high"), "w2": key("low")}


def test_a_job_is_never_ahead_of_itself_even_from_an_older_rank():
    line = WaitingLine()
    line.join(key("a"), rank_of(100, T0, key("a")), frozenset({"w1"}))
    # Its class was deleted: it now asks at priority 0, and its old entry must not hold it.
    assert line.ahead_on(key("a"), rank_of(0, T0, key("a"))) == {}
    line.join(key("b"), rank_of(50, T0, key("b")), frozenset({"w1"}))
    assert {w: job_of(r) for w, r in line.ahead_on(key("a"), rank_of(0, T0, key("a")))
            .items()} == {"w1": key("b")}


def test_held_jobs_are_released_when_what_held_them_leaves_or_stops_wanting_the_worker():
    line = WaitingLine()
    line.join(key("high"), rank_of(100, T0, key("high")), frozenset({"w1", "w2"}))
    line.join(key("low"), rank_of(0, T0, key("low")), frozenset({"w1"}))
    assert line.hold(key("low"), {key("high")})
    # Rejoining unchanged (the high job still waits) releases nothing.
    assert line.join(key("high"), rank_of(100, T0, key("high")), frozenset({"w1", "w2"})) == set()
    # It no longer wants w1 (its runtime left it, say): the jobs it held are looked at again.
    assert line.join(key("high"), rank_of(100, T0, key("high")), frozenset({"w2"})) == {key("low")}
    assert line.hold(key("low"), {key("high")})
    # It leaves the line (placed): the jobs it held are looked at again, once.
    assert line.leave(key("high")) == {key("low")}
    assert line.leave(key("high")) == set()
    assert [w.key for w in line.order()] == [key("low")]
    # Held by a job that left between the check and the record: look again at once.
    assert not line.hold(key("low"), {key("high")})


def test_a_job_that_falls_back_in_line_releases_the_jobs_it_held():
    line = WaitingLine()
    line.join(key("a"), rank_of(100, T0, key("a")), frozenset({"w1"}))
    line.join(key("b"), rank_of(50, T0, key("b")), frozenset({"w1"}))
    line.hold(key("b"), {key("a")})
    assert line.join(key("a"), rank_of(0, T0, key("a")), frozenset({"w1"})) == {key("b")}
    assert [w.key for w in line.order()] == [key("b"), key("a")]


# --- priorities ------------------------------------------------------------------------

class Classes(Cache):
    """The manager's PriorityClass informer's reading side."""

    def __init__(self, *objs):
        super().__init__(*objs)
        self.handlers = []

    def list(self):
        return list(self.store.values())

    def add_handler(self, handler):
        self.handlers.append(handler)

    def add(self, obj):
        self.store[("", obj["metadata"]["name"])] = obj
        for handler in self.handlers:
            handler("ADDED", None, obj)


def priority_class(name: str, value: int, default: bool = False) -> dict:
    obj = {"metadata": {"name": name}, "value": value}
    if default:
        obj["globalDefault"] = True
    return obj


def test_priority_is_the_highest_class_a_pod_template_names_and_a_missing_class_is_zero():
    classes = PriorityClasses(Classes(priority_class("high", 1000), priority_class("low", 10)))
    assert classes.job_priority(["high"]) == (1000, "high")
    # Replicated jobs naming different classes: the job counts at the highest.
    assert classes.job_priority(["low", "high"]) == (1000, "high")
    # A class the manager does not have is 0, not a guess.
    assert classes.job_priority(["typo"]) == (0, "typo")
    assert classes.job_priority([""]) == (0, "")
    assert classes.job_priority([]) == (0, "")


def test_templates_naming_no_class_get_the_global_default_as_pods_do():
    informer = Classes(priority_class("low", 10))
    classes = PriorityClasses(informer)
    assert classes.job_priority([""]) == (0, "")
    # A race left two marked: Kubernetes' admission takes the lowest.
    informer.add(priority_class("default-b", 70, default=True))
    informer.add(priority_class("default-a", 50, default=True))
    assert classes.job_priority([""]) == (50, "default-a")
    # An initializer naming none beside a trainer naming "low": the higher counts.
    assert classes.job_priority(["", "low"]) == (50, "default-a")


# --- the order on real placement ---------------------------------------------------------

def runtime(name: str, cpu: str, priority_class: str | None = None,
            node_selector: dict | None = None) -> dict:
    pod = {"containers": [{"name": c.NODE, "image": "trainer",
                           "resources": {"requests": {"cpu": cpu}}}]}
    if priority_class:
        pod["priorityClassName"] = priority_class
    if node_selector:
        pod["nodeSelector"] = node_selector
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
            "metadata": {"name": name, "uid": name, "resourceVersion": "1"},
            "spec": {"template": {"spec": {"replicatedJobs": [{
                "name": c.NODE,
                "template": {"metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                             "spec": {"template": {"spec": pod}}}}]}}}}


class Workers(Registry):
    def labels(self, name):
        return {}


def worker(name: str, order: int, cpu: str, *runtimes: dict) -> WorkerCluster:
    capacity = WorkerCapacity(name)
    capacity.on_node("ADDED", None, {
        "metadata": {"name": f"{name}-node", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": cpu, "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    return WorkerCluster(name=name, order=order, fingerprint="", capacity=capacity, active=True,
                         informers={"namespaces": Cache({"metadata": {"name": "ns"}}),
                                    c.CLUSTERTRAININGRUNTIMES: Cache(*runtimes)})


def job(name: str, runtime_name: str, created: str, nodes: int = 1) -> dict:
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                         "creationTimestamp": created},
            "spec": {"runtimeRef": {"name": runtime_name}, "trainer": {"numNodes": nodes}}}


def fill(w: WorkerCluster, name: str, cpu: str) -> None:
    """A placed job holding ``cpu`` on ``w`` (its reservation)."""
    w.capacity.reserve(("ns", name), {"cpu": D(cpu)}, 1)


def placing(order: PlacementOrder, placer: Placer, raw: dict):
    """What the reconciler does: ask the line, place, and tell the line the outcome."""
    turn = order.turn(raw)
    decision = placer.place(raw, turn.skip if turn else None)
    key_ = (raw["metadata"]["namespace"], raw["metadata"]["name"])
    if isinstance(decision, str):
        order.waits(raw, turn)
        return decision
    order.left(key_)
    return decision[0].name


def test_a_low_job_goes_where_the_high_one_cannot_and_waits_where_it_could():
    runtimes = (runtime("big-high", "12", "high"), runtime("small-low", "2", "low"))
    w1, w2 = worker("w1", 0, "16", *runtimes), worker("w2", 1, "8", *runtimes)
    placer = Placer(Workers(w1, w2), "best-fit")
    requeued = []
    order = PlacementOrder(placer, placer.registry,
                           PriorityClasses(Classes(priority_class("high", 1000),
                                                   priority_class("low", 1))),
                           requeued.extend)
    fill(w1, "filler-1", "16")
    fill(w2, "filler-2", "8")
    # 12 cpu: only w1 could ever hold it (w2 has 8 in all).
    assert "needs 12 cpu" in placing(order, placer, job("high", "big-high", T1))
    assert [(w.key, w.priority, w.candidates) for w in order.order()] == [
        (key("high"), 1000, ("w1",))]

    # Room frees on both: the low job, older, may not take w1's, but w2's is its.
    w1.capacity.release(("ns", "filler-1"))
    w2.capacity.release(("ns", "filler-2"))
    fill(w1, "filler-1b", "8")  # w1: 8 free, not enough for the high job yet
    assert placing(order, placer, job("low-a", "small-low", T0)) == "w2"
    # w2 full again; the next low job would fit on w1 only: held there for the high one.
    fill(w2, "filler-2b", "6")
    message = placing(order, placer, job("low-b", "small-low", T0))
    assert "w1: held for ns/high (priority 1000), ahead in the waiting line; this job's " \
           "priority: 1" in message and "w2: needs 2 cpu, 0 free" in message, message
    # Where it would not fit anyway, what it lacks is said, not that it is held.
    fill(w1, "filler-1c", "8")
    message = placing(order, placer, job("low-b", "small-low", T0))
    assert "w1: needs 2 cpu, 0 free" in message and "held" not in message, message
    w1.capacity.release(("ns", "filler-1c"))
    assert [w.key for w in order.order()] == [key("high"), key("low-b")]

    # The high job gets w1's room once enough frees; leaving the line, it hands the job
    # it held back to be looked at again.
    w1.capacity.release(("ns", "filler-1b"))
    assert placing(order, placer, job("high", "big-high", T1)) == "w1"
    assert requeued == [key("low-b")]
    assert placing(order, placer, job("low-b", "small-low", T0)) == "w1"
    assert order.order() == []


def test_capacity_could_fit_ignores_what_runs_and_packs_pod_by_pod():
    capacity = WorkerCapacity("w")
    for name, cpu, pool in (("a", "8", "gpu"), ("b", "8", "cpu")):
        capacity.on_node("ADDED", None, {
            "metadata": {"name": name, "labels": {"pool": pool}}, "spec": {},
            "status": {"allocatable": {"cpu": cpu},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
    capacity.reserve(("ns", "running"), {"cpu": D(16)}, 2)
    assert capacity.could_fit([{"cpu": D(8)}, {"cpu": D(8)}])
    assert not capacity.could_fit([{"cpu": D(9)}])
    assert not capacity.could_fit([{"cpu": D(6)}, {"cpu": D(6)}, {"cpu": D(6)}])
    assert not capacity.could_fit([{"cpu": D(8)}, {"cpu": D(1)}], {"pool": "gpu"})
    assert capacity.could_fit([{"cpu": D(8)}], {"pool": "gpu"})


class _CountedRank(tuple):
    """A rank that counts how often the line reads or compares it: the work of a check."""

    reads = 0

    def __getitem__(self, index):
        _CountedRank.reads += 1
        return tuple.__getitem__(self, index)

    def __lt__(self, other):
        _CountedRank.reads += 1
        return tuple.__lt__(self, other)

    def __gt__(self, other):
        _CountedRank.reads += 1
        return tuple.__gt__(self, other)


def _line_of(length: int) -> WaitingLine:
    """``length`` waiting jobs over three workers, each job a candidate on two of them."""
    line = WaitingLine()
    for i in range(length):
        name = f"job-{i:05d}"
        line.join(key(name), _CountedRank(rank_of(i % 7, T0, key(name))),
                  frozenset({f"w{i % 3}", f"w{(i + 1) % 3}"}))
    return line


def _work(line: WaitingLine, act) -> int:
    """How many times ``act`` on ``line`` read or compared a waiting job's rank."""
    _CountedRank.reads = 0
    act(line)
    return _CountedRank.reads


def test_the_check_before_a_placement_does_not_grow_with_the_line():
    """The question a job asks before it is placed reads the first of each worker's
    candidates, not the line: the same ranks looked at with 10 waiting jobs as with
    3,000; and joining the line looks at a number of them that grows with its logarithm
    (a search per worker), not with its length."""
    newcomer = _CountedRank(rank_of(3, T1, key("new")))
    lines = {length: _line_of(length) for length in (10, 3000)}
    asked = {length: _work(line, lambda line: line.ahead_on(key("new"), newcomer))
             for length, line in lines.items()}
    assert asked[10] == asked[3000] > 0, f"ranks read by one check, by line length: {asked}"
    # A job already waiting asks too: it is never ahead of itself, whatever the length.
    own = {length: _work(line, lambda line: line.ahead_on(
        key("job-00000"), rank_of(0, T0, key("job-00000")))) for length, line in lines.items()}
    assert own[10] == own[3000], f"ranks read by a waiting job's check: {own}"

    def join(line: WaitingLine) -> None:
        line.join(key("new"), newcomer, frozenset({"w0", "w1"}))

    joined = {length: _work(line, join) for length, line in lines.items()}
    # A binary search over each of three sorted lists (the line, and each candidate
    # worker's), about log2 of their length each (12 at 3,000), each step a comparison
    # of two counted ranks: at most 3 x 2 x 13. A walk over the line would read thousands.
    assert joined[3000] <= 3 * 2 * 13, f"ranks read by one join, by line length: {joined}"


def test_dispatcher_status_lists_the_line_read_from_a_dispatchers_state():
    from dispatcher import status_report
    line = [{"position": 1, "namespace": "ns", "name": "high", "priority": 1000,
             "priorityClass": "high", "candidates": ["w1"]},
            {"position": 2, "namespace": "ns", "name": "low", "priority": 0,
             "priorityClass": "", "candidates": []}]
    text = status_report.render({"clusters": [], "trainJobs": [], "workers": {
        "available": True, "source": "http://x/api/state", "capacity": [],
        "waitingLine": line}}, "table")
    rows = [row.split() for row in text.split("\n\n")[-1].splitlines()]
    assert rows == [["POSITION", "NAMESPACE", "TRAINJOB", "PRIORITY", "PRIORITYCLASS",
                     "COULD", "USE"],
                    ["1", "ns", "high", "1000", "high", "w1"],
                    ["2", "ns", "low", "0", "-", "-"]]
