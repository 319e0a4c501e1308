"""What the commands share on the command line: value types, with which argparse reports a
refusal by the flag's name (``argument --workers: must be at least 1, got 0``), the
cluster flags (``--kubeconfig``, ``--context``), ``--version``, and a quiet end when the
output's reader goes away."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from importlib import metadata

from controller_kit.gc_pauses import SWEEP_SECONDS

DISTRIBUTION = "trainjob-dispatcher"


def version() -> str:
    """The installed package's version (both commands ship in one distribution)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version and exit")


def add_cluster_arguments(parser: argparse.ArgumentParser, cluster: str) -> None:
    """``--kubeconfig`` and ``--context``, found as kubectl finds them
    (``controller_kit.kubeclient.find_kubeconfig``)."""
    parser.add_argument("--kubeconfig", help=f"kubeconfig of the {cluster} cluster; when "
                        "omitted, as kubectl: the files $KUBECONFIG lists (merged), else "
                        "~/.kube/config, else (in a Pod) the in-cluster service account")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its "
                        "current-context)")


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number no smaller than ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def seconds(text: str) -> float:
    """A finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds, 0 or more, got {text!r}")
    return value


def add_python_gc_sweep_argument(parser: argparse.ArgumentParser,
                                 default: float | None) -> None:
    """``--python-gc-sweep-interval``, the dispatcher's and the operator's alike
    (controller_kit/gc_pauses.py); ``default`` None where a configuration file fills it in."""
    parser.add_argument(
        "--python-gc-sweep-interval", type=seconds, default=default,
        dest="python_gc_sweep_seconds", metavar="SECONDS",
        help="seconds between full collections of every object the interpreter froze: each "
        "reclaims reference cycles that became garbage while frozen (48 objects after 30 "
        "minutes of 10 new jobs a second) and stops every thread while it walks the caches "
        "(about 100 ms, and 340 ms with 20,000 jobs cached, on two cores); 0: none after "
        f"the one that freezes the caches at start (default: {SWEEP_SECONDS:g}, 6 hours)")


def exit_quietly_on_broken_pipe(main: Callable[[], int]) -> int:
    """Run ``main``; when the reader of our output went away (``status | head``), stop
    without a traceback, as command-line tools do."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python would complain once more while flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
