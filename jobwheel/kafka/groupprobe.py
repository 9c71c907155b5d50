"""Describe a consumer group from a child process, so that librdkafka cannot take the asking
process down.

``describe_consumer_groups`` goes through librdkafka's coordinator-request path, which aborts
the whole process (``rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0'``) or
dies of SIGSEGV when it is asked while the broker stops, restarts or starts (librdkafka issues
3663 and 4605, open; reproduced here with 2.16: a loop of these calls through three broker
restarts aborted every time, with a fresh admin client per call as with one kept for the
whole loop and every answer awaited). No client-side care avoids it, so the one call
``jobwheel health`` and the console need from that path runs in a short-lived child: a crash
there is an error naming it, never a signal of ``jobwheel health`` or of the API server.

The child reads one JSON document on stdin (the admin config, the group, the timeout) and
writes one on stdout: ``{"state": ..., "members": [...]}`` or ``{"error": ..., "code": ...}``.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from typing import Any

from jobwheel.errors import BrokerError

#: Time the child gets beyond the request's own timeout (interpreter start, imports, exit).
_CHILD_EXTRA_S = 10.0


def describe(config: dict[str, Any], group: str, timeout_s: float) -> dict[str, Any]:
    """The group's description as the child reported it; raises :class:`BrokerError` when the
    child reported an error, crashed or did not answer in time."""
    plain = {k: v for k, v in config.items() if isinstance(v, str | int | float | bool)}
    request = json.dumps({"config": plain, "group": group, "timeout_s": timeout_s})
    try:
        done = subprocess.run(
            # -P: not the working folder first on the import path, where a folder named
            # jobwheel would take the package's name (deploy.stack.jobwheel says more)
            [sys.executable, "-P", "-m", "jobwheel.kafka.groupprobe"],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout_s + _CHILD_EXTRA_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed the child
        raise BrokerError(
            f"describing group {group} did not finish within {timeout_s + _CHILD_EXTRA_S:g}s",
            code="_TIMED_OUT",
        ) from exc
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise BrokerError(
            f"describing group {group}: the Kafka client died of {name} while the broker's "
            "group coordinator was unreachable (a librdkafka bug, contained in a child "
            "process); ask again once the broker is up",
            code="_CLIENT_CRASHED",
        )
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise BrokerError(
            f"describing group {group}: no answer from the child (exit {done.returncode}): "
            f"{done.stderr.strip()[-300:]}"
        ) from exc
    if "error" in answer:
        raise BrokerError(answer["error"], code=answer.get("code"))
    return dict(answer)


def _child() -> None:
    """In the child: ask once, print one JSON line, exit."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    request = json.loads(sys.stdin.read())
    group, timeout_s = request["group"], float(request["timeout_s"])
    quiet = logging.getLogger("jobwheel.kafka.groupprobe.librdkafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    admin = AdminClient({**request["config"], "logger": quiet})
    try:
        found = admin.describe_consumer_groups([group], request_timeout=timeout_s)
        description = found[group].result(timeout=timeout_s + 1)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        text = err.str() if hasattr(err, "str") else str(exc)
        code = err.name() if hasattr(err, "name") else None
        print(json.dumps({"error": f"{text} ({code})", "code": code}), flush=True)
        return
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    members = [
        {
            "client_id": m.client_id,
            "host": m.host,
            "member_id": m.member_id,
            "assigned": [
                [tp.topic, tp.partition]
                for tp in (m.assignment.topic_partitions if m.assignment else [])
            ],
        }
        for m in description.members
    ]
    state = getattr(description.state, "name", str(description.state))
    print(json.dumps({"state": state, "members": members}), flush=True)


if __name__ == "__main__":
    _child()
