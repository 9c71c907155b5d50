"""Ports for local brokers are picked outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from jobwheel.deploy.broker import ephemeral_ports, free_port


def test_free_ports_are_bindable_and_never_ones_outgoing_connections_use() -> None:
    # A port from the ephemeral range can be taken as the source port of a client retrying
    # a stopped broker on it (a self-connect), and the broker then cannot start again.
    low, high = ephemeral_ports()
    ports = {free_port() for _ in range(50)}
    assert not [p for p in ports if low <= p <= high]
    assert len(ports) > 40  # random picks: processes picking at once rarely collide
    port = ports.pop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert port not in {free_port() for _ in range(200)}  # a listening port is not free
