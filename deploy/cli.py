"""Subcommands of the ``jobwheel`` CLI that belong to ``deploy``.

``jobwheel broker start|stop|status`` run the local no-Docker broker, ``jobwheel topics
ensure`` provisions topics, ``jobwheel up`` runs the whole local stack (``make run``).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from jobwheel.settings import get_settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this package's subcommands; each sets ``handler=`` to a function of the args."""
    broker = sub.add_parser("broker", help="run a local single-node Kafka broker (no Docker)")
    broker_sub = broker.add_subparsers(dest="broker_command", required=True, metavar="ACTION")

    start = broker_sub.add_parser(
        "start", help="start the broker in the background and wait until it answers"
    )
    _broker_args(start, ports=True)
    start.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached; Ctrl-C (or SIGTERM) stops the broker",
    )
    start.set_defaults(handler=_broker_start)

    stop = broker_sub.add_parser("stop", help="stop the broker of the data dir")
    _broker_args(stop, ports=False)
    stop.set_defaults(handler=_broker_stop)

    status = broker_sub.add_parser("status", help="is the broker of the data dir running?")
    _broker_args(status, ports=False)
    status.set_defaults(handler=_broker_status)

    topics = sub.add_parser("topics", help="topic provisioning")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    ensure = topics_sub.add_parser(
        "ensure", help="create missing topics; fail if one has another partition count"
    )
    ensure.set_defaults(handler=_topics_ensure)

    up = sub.add_parser("up", help="run the local stack: broker, topics and services, until Ctrl-C")
    _broker_args(up, ports=True, data_dir_help="jobwheel data dir (default: $JOBWHEEL_DATA_DIR)")
    up.set_defaults(handler=_up)


def _broker_args(
    parser: argparse.ArgumentParser,
    *,
    ports: bool,
    data_dir_help: str = "broker data directory (default: $JOBWHEEL_DATA_DIR/kafka)",
) -> None:
    parser.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    if ports:
        parser.add_argument(
            "--port", type=int, default=None, help="client port (default: $JOBWHEEL_BROKER_PORT)"
        )
        parser.add_argument(
            "--controller-port",
            type=int,
            default=None,
            help="KRaft controller port (default: $JOBWHEEL_BROKER_CONTROLLER_PORT)",
        )


def _broker(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from deploy.broker import LocalBroker

    return LocalBroker.from_settings(
        get_settings(),
        data_dir=args.data_dir,
        port=getattr(args, "port", None),
        controller_port=getattr(args, "controller_port", None),
    )


def _broker_start(args: argparse.Namespace) -> int:
    broker = _broker(args)
    if not args.foreground:
        seconds = broker.start()
        print(f"broker ready at {broker.bootstrap} ({seconds:.1f}s); data dir {broker.data_dir}")
        print(f"log: {broker.log_path}; stop with `jobwheel broker stop`")
        return 0
    stop = _stop_event()
    seconds = broker.start(die_with_parent=True)
    print(f"broker ready at {broker.bootstrap} ({seconds:.1f}s); data dir {broker.data_dir}")
    print(f"log: {broker.log_path}; Ctrl-C stops it", flush=True)
    try:
        while not stop.wait(0.5):
            if broker.running_pid() is None:
                print(f"broker exited; see {broker.log_path}", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0


def _broker_stop(args: argparse.Namespace) -> int:
    broker = _broker(args)
    if broker.stop():
        print(f"broker stopped (data dir {broker.data_dir})")
    else:
        print(f"no broker running for data dir {broker.data_dir}")
    return 0


def _broker_status(args: argparse.Namespace) -> int:
    status = _broker(args).status()
    print(status.describe())
    return 0 if status.running else 3


def _topics_ensure(args: argparse.Namespace) -> int:
    from deploy.topics import ensure_topics

    settings = get_settings()
    created = ensure_topics(settings)
    for name in created:
        print(f"created {name}")
    total = len(settings.topics.specs())
    print(
        f"{total} topics present with {settings.partitions} partitions "
        f"(prefix {settings.topic_prefix}, bootstrap {settings.bootstrap_servers})"
    )
    return 0


def _up(args: argparse.Namespace) -> int:
    from deploy.stack import Stack

    stack = Stack(
        get_settings(),
        data_dir=args.data_dir,
        port=args.port,
        controller_port=args.controller_port,
    )
    return stack.run(_stop_event())


def _stop_event() -> threading.Event:
    """An event set by SIGINT/SIGTERM, so the handler can shut things down in order."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread (tests)
            signal.signal(sig, handle)
    return stop
