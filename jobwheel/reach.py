"""Is Kafka there at all? A TCP probe of the bootstrap servers before a command talks to them.

librdkafka retries a refused connection until the call's timeout (a producer's delivery
timeout is 30 s), so a command run while the broker is down would say nothing for that long.
A refused connection is final, though: when no bootstrap server accepts one, the command can
say so at once. A server that accepts is then asked for metadata by the client itself (with
TLS or SASL in front, a TCP connection alone proves little).
"""

from __future__ import annotations

import socket

from jobwheel.errors import BrokerConnectionError


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a bootstrap list (``a:9092,PLAINTEXT://b:9093,[::1]:9094``)."""
    out: list[tuple[str, int]] = []
    for item in bootstrap.split(","):
        item = item.strip().rpartition("://")[2]
        host, _, port = item.rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def unreachable(bootstrap: str, timeout_s: float = 2.0) -> str | None:
    """None when some bootstrap server accepts a TCP connection within ``timeout_s``, else
    why none did (the first server's error)."""
    addresses = bootstrap_addresses(bootstrap)
    if not addresses:
        return f"{bootstrap!r} names no host:port"
    first: str | None = None
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as exc:
            first = first or (exc.strerror or type(exc).__name__).lower()
    return first


def require_reachable(bootstrap: str, timeout_s: float = 2.0) -> None:
    """Raise :class:`BrokerConnectionError`, one line naming the address tried, when no
    bootstrap server accepts a connection."""
    why = unreachable(bootstrap, timeout_s)
    if why is not None:
        raise BrokerConnectionError(
            f"cannot reach Kafka at {bootstrap} ({why}): is the broker running? "
            "(`jobwheel broker status`; start one with `make run` or `jobwheel broker start`, "
            "or point JOBWHEEL_BOOTSTRAP_SERVERS at a running one)",
            code="TRANSPORT",
        )
