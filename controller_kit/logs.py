"""Logging set-up shared by both commands: text for people, JSON lines for collectors."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType

# The object a thread is working on (namespace, name, cluster). Every log line written
# while it is set carries it, so a line never has to repeat it by hand to be findable.
FIELDS = ("namespace", "name", "cluster")
# The default is shared by every context that sets nothing: read-only (a change sets a new
# mapping, never alters the one it read).
_context: ContextVar[Mapping[str, str]] = ContextVar("log_context",
                                                     default=MappingProxyType({}))
_process: dict[str, str] = {}  # fields true of the whole process, e.g. its cluster


@contextlib.contextmanager
def context(**fields: str | None) -> Iterator[None]:
    """Within the block, log lines carry ``fields`` (added to any already set)."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: str | None) -> None:
    """Add ``fields`` to the current block's context, e.g. the cluster once it is known."""
    _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})


def set_process_fields(**fields: str | None) -> None:
    """Fields every line of this process carries unless a context says otherwise."""
    _process.clear()
    _process.update({k: v for k, v in fields.items() if v})


class _ContextFilter(logging.Filter):
    # One attribute of its own: "name" is already the logger's name on every record.
    def filter(self, record: logging.LogRecord) -> bool:
        record.subject = {**_process, **_context.get()}
        return True


def _subject(record: logging.LogRecord) -> dict[str, str]:
    return getattr(record, "subject", {})


class TextFormatter(logging.Formatter):
    """The classic line, then ``key=value`` for the object the line is about."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        subject = _subject(record)
        pairs = [f"{key}={subject[key]}" for key in FIELDS if key in subject]
        if not pairs:
            return line
        head, sep, rest = line.partition("\n")  # keep tracebacks below the fields
        return f"{head} {' '.join(pairs)}{sep}{rest}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_subject(record))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
        logging.Formatter.converter = time.gmtime
    else:
        handler.setFormatter(TextFormatter())
    # Neither format shows the thread, the process or the caller's line: the standard
    # library's documented switches spare looking them up for every record.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client's own urllib3 retries are noise at info level, and its "Retrying ...
    # connection refused" warnings repeat what the informers and reconcilers report once
    # per state change: a worker on a closed port would log several a second.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The --log-level and --log-format flags both commands take."""
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"),
                        help="least severe messages to log (default: %(default)s)")
    parser.add_argument("--log-format", default="text", choices=("text", "json"),
                        help="text for people, JSON lines for collectors (default: %(default)s)")
