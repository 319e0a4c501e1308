"""Fixtures for tests that run the real training operator against the harness's clusters.

``run_operator(cluster, *args)`` starts ``python -m training_operator run`` as a separate
process against ``cluster`` (so restarts and crashes are real), waits until /readyz says
its caches are synced, and stops it at the end of the test. The process dies with pytest.
"""

from __future__ import annotations

import ctypes
import http.client
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusters.controlplane import free_port
from clusters.testing import eventually


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_file: Path, extra_args: tuple[str, ...]):
        self.kubeconfig = kubeconfig
        self.log_file = log_file
        self.extra_args = extra_args
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        argv = [sys.executable, "-m", "training_operator", "run",
                "--kubeconfig", str(self.kubeconfig),
                "--metrics-port", str(self.metrics_port), *self.extra_args]
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        eventually(self.readyz, lambda answer: answer == (200, "ok"),
                   expected=f"operator /readyz to answer 200 ok (log: {self.log_file})",
                   timeout=60)
        return self

    def readyz(self) -> tuple[int, str]:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        return self.get("/readyz")

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def metric(self, name: str) -> float:
        """Sum of a metric's samples (all label sets) from the operator's /metrics."""
        _, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM, 0, 0, 0)


@pytest.fixture
def run_operator(tmp_path):
    started: list[OperatorProcess] = []

    def start(cluster, *extra_args: str) -> OperatorProcess:
        process = OperatorProcess(cluster.kubeconfig,
                                  tmp_path / f"operator-{cluster.name}-{len(started)}.log",
                                  extra_args)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()
