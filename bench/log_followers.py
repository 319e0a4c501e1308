"""Log followers for ``--suite log-streams``: a process of its own that plays the users who
follow their jobs' logs (``kubectl get --raw '.../log?follow=true'``) through the manager
apiserver's aggregation layer, and plays the containers printing those lines.

It runs apart from the benchmark so that reading the streams does not take the benchmark
process's interpreter, whose watches time every dispatch. ``python -m bench.log_followers``
reads one JSON line on stdin: the user's kubeconfig, the log paths to follow (one stream
each, each on a thread of its own), the log files to append to (each worker's, which kwok
serves as every container's log) and how many lines a second. It then answers commands
on stdin, one per line, with one JSON line on stdout:

* ``state``: each stream's HTTP status (None before the answer), bytes and lines so far,
  whether it ended and why;
* ``stop`` (or end of input): every stream cut, the same figures a last time; then it exits.

Before any command it prints one JSON line per stream as soon as the stream's answer
(status) came, and ``{"ready": true}`` once each stream has either been refused or
received its first line.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml

# A stream that receives nothing for this long is given up (the writer adds lines every
# fraction of a second, so only a broken stream waits this long).
READ_TIMEOUT_SECONDS = 120.0
CHUNK = 64 * 1024
# What a training container prints: a step's figures, about 100 bytes a line.
LINE = ("step {step} loss {loss:.4f} lr 3.0e-04 grad_norm 1.2345 tokens/s 12345.6 "
        "gpu_mem 38.2GiB")


def _pem(user: dict, name: str) -> bytes:
    data = user.get(f"{name}-data")
    if data:
        return base64.b64decode(data)
    return Path(user[name]).read_bytes()


def ssl_context(kubeconfig: Path, directory: Path) -> tuple[ssl.SSLContext, str]:
    """A client TLS context for the kubeconfig's current context (its CA, its user's
    client certificate) and the server's URL."""
    config = yaml.safe_load(kubeconfig.read_text())
    context_name = config.get("current-context") or config["contexts"][0]["name"]
    current = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == current["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == current["user"])
    context = ssl.create_default_context(
        cadata=_pem(cluster, "certificate-authority").decode())
    cert, key = directory / "user.crt", directory / "user.key"
    cert.write_bytes(_pem(user, "client-certificate"))
    key.write_bytes(_pem(user, "client-key"))
    key.chmod(0o600)
    context.load_cert_chain(cert, key)
    return context, cluster["server"]


class Stream:
    """One user following one log: its answer's status and what it received."""

    def __init__(self, index: int, server: str, path: str, context: ssl.SSLContext,
                 report):
        self.index, self.path = index, path
        self.status: int | None = None
        self.message = ""
        self.bytes = 0
        self.lines = 0
        self.ended: str | None = None
        self.first_line = threading.Event()
        parts = urlsplit(server)
        self._connection = http.client.HTTPSConnection(
            parts.hostname, parts.port or 443, context=context, timeout=READ_TIMEOUT_SECONDS)
        self._stopping = threading.Event()
        self._report = report
        self.thread = threading.Thread(target=self._follow, daemon=True,
                                       name=f"follow-{index}")

    def _follow(self) -> None:
        try:
            self._connection.request("GET", self.path, headers={"Accept": "*/*"})
            answer = self._connection.getresponse()
            self.status = answer.status
            if answer.status != 200:
                body = answer.read()
                try:
                    self.message = json.loads(body).get("message", "")
                except ValueError:
                    self.message = body.decode(errors="replace")[:300]
                self.ended = f"refused {answer.status}"
                self._report({"stream": self.index, "status": answer.status,
                              "message": self.message})
                return
            self._report({"stream": self.index, "status": 200})
            while True:
                data = answer.read1(CHUNK)
                if not data:
                    self.ended = ("stopped" if self._stopping.is_set()
                                  else "the server ended it")
                    return
                self.bytes += len(data)
                self.lines += data.count(b"\n")
                if self.lines:
                    self.first_line.set()
        except (OSError, ValueError, http.client.HTTPException) as err:
            # (A cut connection mid-chunk reads as an empty chunk size: ValueError.)
            self.ended = ("stopped" if self._stopping.is_set()
                          else f"{type(err).__name__}: {err}")
        finally:
            self.first_line.set()  # whatever happened, it waits for nothing more

    def stop(self) -> None:
        self._stopping.set()
        sock = self._connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._connection.close()

    def figures(self) -> dict:
        return {"status": self.status, "bytes": self.bytes, "lines": self.lines,
                "ended": self.ended, **({"message": self.message} if self.message else {})}


class Writer:
    """Appends a line to every log file ``rate`` times a second, as running containers
    print (kwok serves each worker's file as every container's log and follows it)."""

    def __init__(self, files: list[str], rate: float):
        self.files, self.rate = [Path(f) for f in files], rate
        self.written = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="log-writer")

    def _run(self) -> None:
        outputs = [path.open("a") for path in self.files]
        started = time.monotonic()
        try:
            while True:
                now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                line = f"{now} stdout F " + LINE.format(step=self.written,
                                                        loss=1 / (1 + self.written)) + "\n"
                for out in outputs:
                    out.write(line)
                    out.flush()
                self.written += 1
                # Paced from the start: the n-th line is due n / rate seconds in.
                if self._stop.wait(max(0.0, started + self.written / self.rate
                                       - time.monotonic())):
                    return
        finally:
            for out in outputs:
                out.close()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    lock = threading.Lock()

    def report(obj: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    with tempfile.TemporaryDirectory(prefix="bench-log-followers-") as directory:
        context, server = ssl_context(Path(spec["kubeconfig"]), Path(directory))
        writer = Writer(spec["log_files"], spec["lines_per_second"])
        writer.thread.start()
        streams = [Stream(i, server, path, context, report)
                   for i, path in enumerate(spec["paths"])]
        for stream in streams:
            stream.thread.start()

        def figures() -> dict:
            return {"streams": [s.figures() for s in streams], "lines_written": writer.written,
                    "at": time.time()}

        def announce_ready() -> None:
            for stream in streams:
                stream.first_line.wait()
            report({"ready": True})

        threading.Thread(target=announce_ready, daemon=True).start()
        for command in sys.stdin:
            command = command.strip()
            if command == "state":
                report(figures())
            elif command == "stop":
                break
        for stream in streams:
            stream.stop()
        for stream in streams:
            stream.thread.join(10)
        writer.stop()
        report(figures())
    return 0


if __name__ == "__main__":
    sys.exit(main())
