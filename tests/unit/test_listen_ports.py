"""The harness picks listening ports outside the kernel's ephemeral range, so an outgoing
connection cannot take one between the pick and the component's bind."""

import socket

from clusters import controlplane


def test_free_ports_are_outside_the_ephemeral_range_and_never_repeat():
    low, high = controlplane._ephemeral_range()
    ports = [controlplane.free_port() for _ in range(200)]
    inside = [p for p in ports if low <= p <= high]
    assert not inside, f"ports inside the ephemeral range {low}-{high}: {inside}"
    assert len(set(ports)) == len(ports), f"a port was handed out twice: {sorted(ports)}"


def test_a_port_someone_listens_on_is_not_handed_out(monkeypatch):
    sockets, free = [], None
    try:
        for port in controlplane.listen_port_candidates()[:20]:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            if free is None:  # the one port left unheld
                sock.close()
                free = port
                continue
            sock.listen()
            sockets.append(sock)
        held = [s.getsockname()[1] for s in sockets]
        monkeypatch.setattr(controlplane, "listen_port_candidates", lambda: [*held, free])
        monkeypatch.setattr(controlplane, "_handed_out", set())
        picked = controlplane.free_port()
        assert picked == free, (
            f"expected the only free candidate {free}, got {picked} (held: {held})")
    finally:
        for sock in sockets:
            sock.close()
