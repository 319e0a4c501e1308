"""Memory and CPU of one process, read from /proc while a scenario runs."""

from __future__ import annotations

import os
import threading
import time

from bench import host_speed

_TICKS = os.sysconf("SC_CLK_TCK")


def _status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/{pid}/status has no {field} line")


def rss_bytes(pid: int) -> int:
    """The process's resident memory now."""
    return _status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory the process has had."""
    return _status_bytes(pid, "VmHWM")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name (field 2) may hold spaces; fields after its ')' are fixed.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class FootprintWindow:
    """``with FootprintWindow(pid) as window:`` samples RSS every ``interval`` seconds;
    afterwards ``figures()`` gives peak and final RSS, CPU seconds and CPU share."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True,
                                        name=f"footprint-{pid}")

    def __enter__(self) -> FootprintWindow:
        self.started = time.monotonic()
        self.cpu_start = cpu_seconds(self.pid)
        self.peak_rss = rss_bytes(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.wall = time.monotonic() - self.started
        self.cpu = cpu_seconds(self.pid) - self.cpu_start
        self.end_rss = rss_bytes(self.pid)
        self.peak_rss = max(self.peak_rss, self.end_rss)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))
            except (OSError, ValueError):
                return  # the process ended; __exit__ reports it

    def figures(self) -> dict:
        return {
            "wall_seconds": round(self.wall, 2),
            "cpu_seconds": round(self.cpu, 2),
            "cpu_share": round(self.cpu / self.wall, 3) if self.wall else None,
            "peak_rss_mb": round(self.peak_rss / 2**20, 1),
            "end_rss_mb": round(self.end_rss / 2**20, 1),
        }


def host_cpu_times() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    busy, total, _ = _host_stat()
    return busy, total


def _host_stat() -> tuple[float, float, float]:
    """(busy, total, stolen) CPU seconds of the whole machine so far. Stolen time (a
    virtual machine's CPUs running another guest) counts as busy: nothing here could use
    it; it is kept apart too, to tell a slow host from a loaded one."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already part of user time
    return (total - idle) / _TICKS, total / _TICKS, fields[7] / _TICKS


class CpuAccount:
    """``with CpuAccount({"group": [pid, ...]}) as account:`` CPU seconds each group of
    processes used in the block, and how busy the whole machine was (other work included)."""

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups

    def _read(self) -> dict[str, float]:
        used = {}
        for group, pids in self.groups.items():
            total = 0.0
            for pid in pids:
                try:
                    total += cpu_seconds(pid)
                except OSError:
                    pass  # ended meanwhile; the rest of the group still counts
            used[group] = total
        return used

    def __enter__(self) -> CpuAccount:
        self.started = time.monotonic()
        self.wall_started = time.time()
        self.host_start = _host_stat()
        self.start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.monotonic() - self.started
        end = self._read()
        self.used = {group: end[group] - self.start[group] for group in end}
        busy, total, stolen = _host_stat()
        self.host_busy = busy - self.host_start[0]
        self.host_total = total - self.host_start[1]
        self.host_stolen = stolen - self.host_start[2]
        self.host_seen = host_speed.seen_between(self.wall_started, time.time())

    def figures(self) -> dict:
        figures = {
            "cpu_seconds": {group: round(s, 2) for group, s in self.used.items()},
            "host_busy_share": round(self.host_busy / self.host_total, 3)
            if self.host_total else None,
            "host_cpu_seconds_available": round(self.host_total, 1),
            "host_steal_share": round(self.host_stolen / self.host_total, 3)
            if self.host_total else None,
        }
        if self.host_seen is not None:
            # How much of the window the host itself was slow (bench.host_speed's probe).
            figures["host_slow_share"] = round(self.host_seen.slow_share, 3)
            figures["host_probe_readings"] = self.host_seen.readings
            if self.host_seen.cache_read_ns is not None:
                figures["host_cache_read_ns"] = self.host_seen.cache_read_ns
        return figures


def cpu_sum(accounts: list[dict]) -> dict:
    """``CpuAccount.figures()`` of several windows as one: seconds added up, the machine's
    busy (and stolen) share weighted by each window's length."""
    seconds: dict[str, float] = {}
    for account in accounts:
        for group, used in account["cpu_seconds"].items():
            seconds[group] = round(seconds.get(group, 0.0) + used, 2)
    available = sum(a["host_cpu_seconds_available"] for a in accounts)

    def weighted(share: str) -> float | None:
        known = [a for a in accounts if a.get(share) is not None]
        if not available or not known:
            return None
        return round(sum(a[share] * a["host_cpu_seconds_available"] for a in known)
                     / available, 3)

    merged = {"cpu_seconds": seconds, "host_cpu_seconds_available": round(available, 1),
              "host_busy_share": weighted("host_busy_share")}
    if any("host_steal_share" in a for a in accounts):
        merged["host_steal_share"] = weighted("host_steal_share")
    probed = [a for a in accounts if a.get("host_probe_readings")]
    if probed:
        readings = sum(a["host_probe_readings"] for a in probed)
        merged["host_slow_share"] = round(
            sum(a["host_slow_share"] * a["host_probe_readings"] for a in probed) / readings, 3)
        merged["host_probe_readings"] = readings
        read = [a for a in probed if a.get("host_cache_read_ns") is not None]
        if read:
            # The windows' medians, weighted by their readings.
            merged["host_cache_read_ns"] = round(
                sum(a["host_cache_read_ns"] * a["host_probe_readings"] for a in read)
                / sum(a["host_probe_readings"] for a in read), 1)
    return merged
