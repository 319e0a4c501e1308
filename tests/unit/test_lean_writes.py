"""Writes over kept-alive connections (``controller_kit.lean_http``, ``.writes``), against
an HTTP server on loopback that records what it was sent: the request arrives as the
client would have sent it, an error answer is the client's ApiException, and a
connection the server closed between two writes costs nothing but a second attempt."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes.client.exceptions import ApiException

from controller_kit import lean_http, writes
from controller_kit.kubeclient import api_client


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as an apiserver
    seen: list[tuple[str, str, str, dict, int]] = []
    credentials: list[str | None] = []
    close_after_next = threading.Event()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        port = self.connection.getpeername()[1]
        self.credentials.append(self.headers.get("Authorization"))
        self.seen.append((self.command, self.path, self.headers.get("Content-Type"), body,
                          port))
        if self.path.endswith("/missing"):
            status, answer = 404, {"kind": "Status", "reason": "NotFound",
                                   "message": 'widgets "missing" not found', "code": 404}
        else:
            status, answer = (201 if self.command == "POST" else 200), {
                **(body or {}), "metadata": {"name": "w", "resourceVersion": "7"}}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.close_after_next.is_set():
            self.close_after_next.clear()
            self.close_connection = True

    do_POST = do_PATCH = do_PUT = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    Recorder.seen, Recorder.credentials = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def client_for(httpd):
    host, port = httpd.server_address
    return api_client({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://{host}:{port}"}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]})


def test_a_create_and_a_merge_patch_arrive_as_the_client_would_send_them(server):
    api = client_for(server)
    created = writes.create(api, "example.io", "v1", "ns", "widgets",
                            {"metadata": {"name": "w"}, "spec": {"size": 3}},
                            field_manager="tester")
    patched = writes.merge_patch(api, "example.io", "v1", "ns", "widgets", "w",
                                 {"metadata": {"labels": {"a": "b"}}})
    assert created["metadata"]["resourceVersion"] == "7" and created["spec"] == {"size": 3}
    assert patched["metadata"]["name"] == "w"
    (post, path, ctype, body, first), (patch, ppath, pctype, pbody, second) = Recorder.seen
    assert (post, path, ctype) == ("POST", "/apis/example.io/v1/namespaces/ns/widgets"
                                   "?fieldManager=tester", "application/json")
    assert body == {"metadata": {"name": "w"}, "spec": {"size": 3}}
    assert (patch, ppath, pctype, pbody) == (
        "PATCH", "/apis/example.io/v1/namespaces/ns/widgets/w",
        "application/merge-patch+json", {"metadata": {"labels": {"a": "b"}}})
    # One connection, kept alive between the two writes, and the user's credentials.
    assert first == second
    assert Recorder.credentials == ["Bearer secret-token"] * 2


def test_an_error_answer_is_the_clients_exception_with_the_apiservers_message(server):
    api = client_for(server)
    with pytest.raises(ApiException) as refused:
        writes.merge_patch(api, "example.io", "v1", "ns", "widgets", "missing", {"a": 1})
    assert refused.value.status == 404
    assert json.loads(refused.value.body)["message"] == 'widgets "missing" not found'



def test_a_connection_the_server_closed_is_replaced_and_nothing_is_lost(server):
    api = client_for(server)
    Recorder.close_after_next.set()
    writes.create(api, "example.io", "v1", "ns", "widgets", {"metadata": {"name": "a"}})
    # The server closed the kept-alive connection after answering: the next write still
    # goes through, exactly once more on the server.
    writes.create(api, "example.io", "v1", "ns", "widgets", {"metadata": {"name": "b"}})
    names = [body["metadata"]["name"] for _, _, _, body, _ in Recorder.seen]
    assert names == ["a", "b"], names
    ports = [port for *_, port in Recorder.seen]
    assert ports[0] != ports[1], f"the second write came over the closed connection: {ports}"


def test_a_write_goes_out_in_one_send(server, monkeypatch):
    """Head and body leave in one write: each write costs both ends a system call and
    the server a wake-up. The spy passes every write on to the real socket."""
    sent: list[bytes] = []
    original = socket.socket.sendall

    def spy(self, data, *args):
        if self.getpeername() == server.server_address:  # the client's, not the server's
            sent.append(bytes(data))
        return original(self, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", spy)
    api = client_for(server)
    writes.create(api, "example.io", "v1", "ns", "widgets",
                  {"metadata": {"name": "w"}, "spec": {"size": 3}})
    assert len(sent) == 1, f"expected the create to leave in one write, saw {len(sent)}: {sent}"
    head, _, body = sent[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /apis/example.io/v1/namespaces/ns/widgets"), head
    assert json.loads(body) == {"metadata": {"name": "w"}, "spec": {"size": 3}}
    assert Recorder.seen[-1][3] == {"metadata": {"name": "w"}, "spec": {"size": 3}}


def test_a_header_with_a_line_break_is_refused_and_nothing_is_sent(server):
    """A carriage return or a line feed alike: either would end the header early."""
    api = client_for(server)
    for broken in ("one\r\nX-Injected: two", "one\rX-Injected: two", "one\nX-Injected: two"):
        api.default_headers["X-Note"] = broken
        with pytest.raises(ValueError, match="X-Note"):
            writes.create(api, "example.io", "v1", "ns", "widgets", {"metadata": {"name": "w"}})
    assert Recorder.seen == []


def test_a_header_sent_twice_reads_as_one_with_both_values():
    """Two headers of one name in an answer (as apiservers send Warning headers) read as
    one, their values joined, as the client's pool reads them."""
    answer = lean_http._Answer()
    answer.parser.feed_data(b"HTTP/1.1 200 OK\r\nWarning: 299 - \"a\"\r\nwarning: 299 - \"b\"\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
    assert answer.complete and answer.keep_alive and answer.reason == "OK"
    assert answer.headers["warning"] == '299 - "a", 299 - "b"'
