"""Kept-alive connections for the API writes a controller makes per object.

A dispatch is three writes (the placement PATCH, the copy's create, the Event), and
urllib3's pool, under the client library, costs about twice the CPU of a plain
connection per request (pool keys, URL parsing, retry and header objects, a poll for a
dropped connection), and the standard library's ``http.client`` parses each answer's
headers with its e-mail parser: at hundreds of writes a second that is most of a
controller's CPU. So writes (a JSON body, or one already encoded such as an apply patch)
go over one connection per thread and apiserver, with the TLS settings the client's
configuration gives: each request leaves in one write and its answer is read by
``httptools``. Reads, watches and anything unusual (a proxy, another body) keep the
client's pool.

A write on the lean connection that gets no answer (a kept-alive connection the server
closed, a reset) is sent again through the pool, which retries as the client always did.
Every write this project sends may be sent twice: a create answers 409 the second time,
updates carry a resourceVersion, merge and apply patches give the same object twice,
and a repeated Event is only a repeated Event."""

from __future__ import annotations

import re
import socket
import ssl
import threading
from urllib.parse import urlsplit

import httptools
import orjson
import urllib3

# The writes that take this path: bodies already encoded, or dictionaries the client
# would encode as JSON itself.
LEAN_METHODS = frozenset({"POST", "PUT", "PATCH"})
LEAN_CONTENT_TYPES = frozenset({"application/json", "application/merge-patch+json"})


class LeanResponse:
    """What the client library reads of an answer (its ``RESTResponse`` and the raw
    response of ``_preload_content=False`` alike): status, reason, headers, body."""

    def __init__(self, status: int, reason: str, headers: dict[str, str], data: bytes):
        self.status = status
        self.reason = reason
        self.headers = headers
        self.data = data
        self.response = self  # what ``_preload_content=False`` hands the caller

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def release_conn(self) -> None:
        """The body is read already and the connection kept by its thread."""


class LeanWrites:
    """One kept-alive connection per thread and apiserver, for one client configuration
    (one cluster's credentials)."""

    def __init__(self, configuration):
        # Built at the first write, as the pool builds its own at the first request:
        # credentials that cannot be loaded fail that request, not the client's creation.
        self._configuration = configuration
        self._context: ssl.SSLContext | None = None
        self._server_hostname = getattr(configuration, "tls_server_name", None) or None
        self._local = threading.local()

    @staticmethod
    def usable(configuration) -> bool:
        """Whether the configuration's requests may take this path: not through a proxy
        (the pool knows how to tunnel, this does not)."""
        return not configuration.proxy

    @staticmethod
    def takes(method: str, headers: dict | None, body) -> bool:
        """Whether this request is one of the writes this path sends."""
        if method not in LEAN_METHODS:
            return False
        return isinstance(body, bytes) or (
            isinstance(body, (dict, list))
            and (headers or {}).get("Content-Type") in LEAN_CONTENT_TYPES)

    def send(self, method: str, url: str, headers: dict, body,
             timeout: tuple[float, float] | float | None) -> LeanResponse:
        """The answer, whatever its status; raises ``LeanFailed`` when none came (the
        caller sends the request another way) and urllib3's ``ReadTimeoutError`` when
        the server took longer than the read timeout (sending again would only wait
        again). A header with a line break in it is a ``ValueError``, as in the pool."""
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        request = _request_bytes(method, target, parts.netloc, headers,
                                 body if isinstance(body, bytes) else orjson.dumps(body))
        connections = self._connections()
        key = (parts.scheme, parts.netloc)
        conn = connections.get(key)
        if conn is None:
            conn = connections[key] = _Connection(parts, self._tls(parts))
        try:
            return conn.exchange(request, connect, read)
        except TimeoutError as err:
            conn.close()
            raise urllib3.exceptions.ReadTimeoutError(
                None, url, f"timed out (connect timeout={connect}, read timeout={read})"
            ) from err
        except (OSError, httptools.HttpParserError) as err:
            conn.close()
            raise LeanFailed(str(err) or type(err).__name__) from err

    def _connections(self) -> dict:
        connections = getattr(self._local, "connections", None)
        if connections is None:
            connections = self._local.connections = {}
        return connections

    def _tls(self, parts) -> tuple[ssl.SSLContext, str] | None:
        """The TLS context and the name the server's certificate is checked against, or
        None for plain HTTP."""
        if parts.scheme != "https":
            return None
        if self._context is None:
            try:
                self._context = _ssl_context(self._configuration)
            except (OSError, ValueError) as err:  # the pool reports it in its words
                raise LeanFailed(str(err)) from err
        # ``tls-server-name`` when the kubeconfig gives one: the apiserver's certificate
        # names it, not the address connected to.
        return self._context, self._server_hostname or parts.hostname


class LeanFailed(Exception):
    """No answer came on the lean connection."""


def _request_bytes(method: str, target: str, host: str, headers: dict, body: bytes) -> bytes:
    """The whole request, head and body, to go out in one write: each write costs both
    ends a system call, a TLS record and a wake-up of the reader."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}",
             *(f"{name}: {value}" for name, value in headers.items()),
             f"Content-Length: {len(body)}", "", ""]
    head = "\r\n".join(lines)
    # A carriage return or line feed inside a line would end it early: the rest would
    # reach the server as a header of its own.
    if head.count("\r") != len(lines) - 1 or head.count("\n") != len(lines) - 1:
        bad = next((repr(name) for name, value in headers.items()
                    if _BREAK.search(f"{name}{value}")), "the request line or Host")
        raise ValueError(f"{method} {target}: a line break in header {bad}")
    return head.encode("latin-1") + body


_BREAK = re.compile(r"[\r\n]")


class _Answer:
    """Collects one answer as the parser reads it (the parser's callbacks)."""

    __slots__ = ("parser", "reason", "headers", "body", "complete", "keep_alive")

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.complete = False
        self.keep_alive = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        # A header sent twice reads as one, its values joined (as urllib3 reads it).
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.complete = True
        # Only known while the parser is on this answer: it resets for the next one.
        self.keep_alive = self.parser.should_keep_alive()


class _Connection:
    """One kept-alive connection to one apiserver: a request goes out in one write and
    its answer is read through ``httptools`` (llhttp), whose parsing of a status line and
    headers costs a small part of what ``http.client``'s e-mail header parser does."""

    def __init__(self, parts, tls: tuple[ssl.SSLContext, str] | None):
        self._address = (parts.hostname, parts.port or (443 if tls else 80))
        self._tls = tls
        self._sock: socket.socket | None = None
        self._buffer = bytearray(_READ_SIZE)

    def exchange(self, request: bytes, connect: float | None,
                 read: float | None) -> LeanResponse:
        if self._sock is None:
            self._open(connect)
        sock = self._sock
        if sock.gettimeout() != read:  # each setting is a system call or two
            sock.settimeout(read)
        sock.sendall(request)
        answer = _Answer()
        view = memoryview(self._buffer)
        try:
            while not answer.complete:
                count = sock.recv_into(self._buffer)
                if not count:
                    raise ConnectionResetError(
                        "the server closed the connection before answering")
                answer.parser.feed_data(view[:count])
            status = answer.parser.get_status_code()
        finally:
            answer.parser = None  # the parser holds the answer too: no cycle left behind
        if not answer.keep_alive:
            self.close()
        return LeanResponse(status, answer.reason, answer.headers, b"".join(answer.body))

    def _open(self, timeout: float | None) -> None:
        sock = socket.create_connection(self._address, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                context, server_hostname = self._tls
                sock = context.wrap_socket(sock, server_hostname=server_hostname)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()


# Most answers (an object of a few KB) arrive in one read.
_READ_SIZE = 65536


def _ssl_context(configuration) -> ssl.SSLContext:
    """The TLS settings the client's own pool uses: its CA (file or data), client
    certificate, and whether the server is verified and its name checked."""
    if configuration.verify_ssl:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert,
                                             cadata=getattr(configuration, "ca_cert_data", None))
        # ``assert_hostname`` False keeps verification but skips the name, as urllib3 does.
        context.check_hostname = configuration.assert_hostname is not False
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context
