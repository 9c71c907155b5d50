"""Ports for local brokers are picked outside the kernel's ephemeral range."""

from __future__ import annotations

import collections
import socket

import pytest

from jobwheel.deploy import broker
from jobwheel.deploy.broker import ephemeral_ports, free_port


def test_free_ports_are_bindable_and_never_ones_outgoing_connections_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A port from the ephemeral range can be taken as the source port of a client retrying
    # a stopped broker on it (a self-connect), and the broker then cannot start again.
    low, high = ephemeral_ports()
    ports = {free_port() for _ in range(50)}
    assert not [p for p in ports if low <= p <= high]
    assert len(ports) > 40  # random picks: processes picking at once rarely collide
    port = ports.pop()
    # Forget what was handed out, so that only the listening socket keeps the port out.
    monkeypatch.setattr(broker, "_HANDED_OUT", collections.deque(maxlen=256))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert port not in {free_port() for _ in range(200)}  # a listening port is not free


def test_ports_asked_for_one_after_the_other_are_never_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker's listener and controller ports are asked for one after the other, before
    either is bound: two random picks of the same port failed a test run's broker start."""
    monkeypatch.setattr(broker, "_HANDED_OUT", collections.deque(maxlen=256))
    monkeypatch.setattr(broker, "FREE_PORT_RANGE", (20_000, 20_007))
    monkeypatch.setattr(broker, "ephemeral_ports", lambda: (32_768, 60_999))
    monkeypatch.setattr(broker, "port_free", lambda port, host: True)
    assert sorted(free_port() for _ in range(8)) == list(range(20_000, 20_008))
