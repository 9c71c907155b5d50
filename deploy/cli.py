"""Subcommands of the ``jobwheel`` CLI that belong to ``deploy``.

``jobwheel broker start|stop|status`` run the local no-Docker broker, ``jobwheel topics
ensure`` provisions topics, ``jobwheel queues add|list`` adds a queue (worker pool) at run time,
``jobwheel up`` runs the whole local stack (``make run``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from jobwheel.settings import get_settings
from jobwheel.signals import on_signals


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this package's subcommands; each sets ``handler=`` to a function of the args."""
    _register_broker(sub)
    _register_topics(sub)
    _register_queues(sub)
    _register_acls(sub)
    _register_up(sub)


def _register_broker(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``broker start|stop|status``: the local Kafka of a data dir."""
    broker = sub.add_parser(
        "broker", help="run a local Kafka broker, or a cluster of them (no Docker)"
    )
    broker_sub = broker.add_subparsers(dest="broker_command", required=True, metavar="ACTION")

    start = broker_sub.add_parser(
        "start", help="start the broker in the background and wait until it answers"
    )
    _broker_args(start, ports=True)
    _node_arg(start, "start only this node of the data dir's cluster (after a stop or a kill)")
    start.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="a KRaft cluster of N nodes on this host, each broker and controller (node 1 on "
        "--port/--controller-port, the others on the next free ports; internal topics with "
        "replication factor min(3, N) and min ISR 2 from 3 nodes); default 1, or the count "
        "of the cluster already in the data dir",
    )
    start.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached; Ctrl-C (or SIGTERM) stops the broker",
    )
    start.add_argument(
        "--secure",
        action="store_true",
        help="TLS, SASL/SCRAM authentication and ACL authorization on every listener (a new "
        "data dir: its CA is tls/ca.pem and the admin's client config admin.json in it); "
        "then `jobwheel acls apply`",
    )
    start.set_defaults(handler=_broker_start)

    stop = broker_sub.add_parser("stop", help="stop the broker (or every node) of the data dir")
    _broker_args(stop, ports=False)
    _node_arg(stop, "stop only this node of the data dir's cluster (SIGTERM, a clean stop)")
    stop.set_defaults(handler=_broker_stop)

    status = broker_sub.add_parser(
        "status", help="is the broker (or each node) of the data dir running?"
    )
    _broker_args(status, ports=False)
    status.set_defaults(handler=_broker_status)


def _register_topics(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``topics ensure``."""
    topics = sub.add_parser("topics", help="topic provisioning")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    ensure = topics_sub.add_parser(
        "ensure", help="create missing topics; fail if one has another partition count"
    )
    ensure.set_defaults(handler=_topics_ensure)


def _register_queues(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``queues add|list``: queues (worker pools) at run time."""
    queues = sub.add_parser("queues", help="queues (worker pools): add one at run time, list them")
    queues_sub = queues.add_subparsers(dest="queues_command", required=True, metavar="ACTION")
    add = queues_sub.add_parser(
        "add",
        help="create a queue's runs topic: schedulers, workers and clients take it without a "
        "restart",
        description="Create the runs topic of queue NAME (co-partitioned with the requests "
        "topic). A queue is its runs topic: running schedulers accept jobs naming it within "
        "about a second, `jobwheel worker --queue NAME` serves it, and the SDK, the API and "
        "`jobwheel submit` stop refusing it, none of them restarted. Idempotent. On a cluster "
        "with ACLs, also declare it in JOBWHEEL_QUEUES and run `jobwheel acls apply`: until "
        "then the roles cannot see its topic and its jobs are refused.",
    )
    add.add_argument("names", nargs="+", metavar="NAME", help="the queue's name, e.g. reports")
    add.set_defaults(handler=_queues_add)
    listing = queues_sub.add_parser(
        "list", help="the queues: declared (JOBWHEEL_QUEUES) and added, with topic and group"
    )
    listing.set_defaults(handler=_queues_list)


def _queues_add(args: argparse.Namespace) -> int:
    from jobwheel.kafka.admin import ensure_topics
    from jobwheel.reach import require_reachable
    from jobwheel.schemas.validation import queue

    settings = get_settings()
    names = list(dict.fromkeys(queue(name) for name in args.names))  # bad: exit 2, one line
    require_reachable(settings.bootstrap_servers)
    topics = settings.topics
    # The requests topic too: a queue's runs topic must have its partition count, which
    # ensure_topics checks against an existing requests topic (and refuses a mismatch).
    specs = [s for s in topics.specs() if s.name == topics.requests]
    specs += [topics.runs_spec(name) for name in names]
    created = set(ensure_topics(settings, specs))
    for name in names:
        topic = topics.runs_for(name)
        verb = "added" if topic in created else "already there:"
        print(
            f"{verb} queue {name}: runs topic {topic} ({settings.partitions} partitions), "
            f"workers: jobwheel worker --queue {name} (group {settings.worker_group_for(name)})"
        )
    return 0


def _queues_list(args: argparse.Namespace) -> int:
    from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister
    from jobwheel.reach import require_reachable

    settings = get_settings()
    require_reachable(settings.bootstrap_servers)
    directory = QueueDirectory(settings, admin_topic_lister(settings, "jobwheel.deploy"))
    names = directory.names(refresh=True)
    if directory.error is not None:
        print(f"jobwheel queues list: cannot read the broker's topics: {directory.error}")
        return 1
    for name in names:
        how = "declared (JOBWHEEL_QUEUES)" if name in directory.declared else "added"
        print(
            f"{name:<20} {how:<27} topic {settings.topics.runs_for(name)}  "
            f"group {settings.worker_group_for(name)}"
        )
    return 0


def _register_acls(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``acls apply|show``: the roles' rights on a secured cluster."""
    acls = sub.add_parser(
        "acls", help="Kafka principals and ACLs: one SCRAM user per role with only what it needs"
    )
    acls_sub = acls.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    apply = acls_sub.add_parser(
        "apply",
        help="create each role's user and ACLs (run with the admin's JOBWHEEL_KAFKA_CONFIG)",
        description="Create or update a SCRAM-SHA-512 user per role (submitter, scheduler, "
        "worker, sink, api) and make its ACLs exactly what the role needs; write each role's "
        "client config (JOBWHEEL_KAFKA_CONFIG) to DIR/<role>.json, mode 0600.",
    )
    apply.add_argument(
        "--role",
        dest="roles",
        action="append",
        metavar="ROLE",
        help="only this role (repeatable; default: all)",
    )
    apply.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="credentials directory (default: $JOBWHEEL_KAFKA_CREDENTIALS_DIR or "
        "$JOBWHEEL_DATA_DIR/kafka-credentials)",
    )
    apply.set_defaults(handler=_acls_apply)
    show = acls_sub.add_parser("show", help="print what each role may do (no broker needed)")
    show.set_defaults(handler=_acls_show)


def _register_up(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``up``: the whole local stack in one command."""
    up = sub.add_parser("up", help="run the local stack: broker, topics and services, until Ctrl-C")
    _broker_args(up, ports=True, data_dir_help="jobwheel data dir (default: $JOBWHEEL_DATA_DIR)")
    up.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        default=None,
        help="use this running Kafka instead of starting the local broker (it is not stopped)",
    )
    up.add_argument(
        "--tasks",
        metavar="MODULE[,MODULE]",
        default=None,
        help="task modules of the stack's worker (default jobwheel.consumers.demo), found in the "
        "current folder too, e.g. --tasks jobwheel.consumers.demo,my_tasks",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="run a local KRaft cluster of N nodes instead of one broker (as `jobwheel broker "
        "start --nodes N`; the topics get replication factor min(3, N))",
    )
    up.add_argument(
        "--secure",
        action="store_true",
        help="the local broker (or cluster) with TLS, SASL/SCRAM and ACLs: topics and ACLs are "
        "made as its admin, and each service runs as its own role (`jobwheel acls apply`; "
        "credentials in DATA_DIR/kafka-credentials)",
    )
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


def _node_arg(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("node", type=int, nargs="?", default=None, metavar="NODE", help=help_text)


def _broker(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The data dir's cluster when it holds one or ``--nodes`` asks for one, else its broker."""
    from jobwheel.deploy.broker import LocalBroker, LocalCluster, is_cluster_dir
    from jobwheel.errors import ConfigError

    settings = get_settings()
    nodes = getattr(args, "nodes", None)
    data_dir = args.data_dir or settings.data_dir / "kafka"
    secure = getattr(args, "secure", False)
    if is_cluster_dir(data_dir) or (nodes or 1) > 1:
        if is_cluster_dir(data_dir) and nodes is None:
            return LocalCluster.from_settings(settings, data_dir=data_dir, secure=secure)
        return LocalCluster.from_settings(
            settings,
            nodes=nodes or 1,
            data_dir=data_dir,
            port=getattr(args, "port", None),
            controller_port=getattr(args, "controller_port", None),
            secure=secure,
        )
    if getattr(args, "node", None) is not None:
        raise ConfigError(
            f"NODE is for the nodes of a local cluster, and {data_dir} holds none: "
            "start one with `jobwheel broker start --nodes 3`"
        )
    return LocalBroker.from_settings(
        get_settings(),
        data_dir=args.data_dir,
        port=getattr(args, "port", None),
        controller_port=getattr(args, "controller_port", None),
        secure=secure,
    )


def _print_secure(broker) -> None:  # type: ignore[no-untyped-def]
    if broker.secure:
        print(
            "secure: SASL/SCRAM over TLS (SASL_SSL) and ACLs; CA certificate "
            f"{broker.ca_cert_path}; admin client config in {broker.admin_config_path}\n"
            f'  export JOBWHEEL_KAFKA_CONFIG="$(cat {broker.admin_config_path})"   # the admin\n'
            "  jobwheel topics ensure && jobwheel acls apply    # then one role per process"
        )


def _broker_start(args: argparse.Namespace) -> int:
    from jobwheel.deploy.broker import LocalCluster

    broker = _broker(args)
    if isinstance(broker, LocalCluster):
        return _cluster_start(broker, args)
    if not args.foreground:
        seconds = broker.start()
        print(f"broker ready at {broker.bootstrap} ({seconds:.1f}s); data dir {broker.data_dir}")
        print(f"log: {broker.log_path}; stop with `jobwheel broker stop`")
        _print_secure(broker)
        return 0
    stop = _stop_event()
    seconds = broker.start(die_with_parent=True)
    print(f"broker ready at {broker.bootstrap} ({seconds:.1f}s); data dir {broker.data_dir}")
    print(f"log: {broker.log_path}; Ctrl-C stops it", flush=True)
    _print_secure(broker)
    try:
        while not stop.wait(0.5):
            if broker.running_pid() is None:
                print(f"broker exited; see {broker.log_path}", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0


def _cluster_start(cluster, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    if args.node is not None:
        node = cluster.node(args.node)
        seconds = cluster.start_node(args.node)
        print(f"node {args.node} ready at {node.bootstrap} ({seconds:.1f}s); log {node.log_path}")
        return 0
    stop = _stop_event() if args.foreground else None
    seconds = cluster.start(die_with_parent=args.foreground)
    print(
        f"cluster of {len(cluster.nodes)} nodes ready at {cluster.bootstrap} ({seconds:.1f}s); "
        f"data dir {cluster.data_dir}"
    )
    print(
        f'use it with JOBWHEEL_BOOTSTRAP_SERVERS="{cluster.bootstrap}"; logs in '
        f"{cluster.data_dir}/node*/logs; stop with `jobwheel broker stop` (one node: "
        "`jobwheel broker stop NODE`)",
        flush=True,
    )
    _print_secure(cluster)
    if stop is None:
        return 0
    try:
        while not stop.wait(0.5):
            if cluster.status().running == 0:
                print(f"every node exited; see {cluster.data_dir}/node*/logs", file=sys.stderr)
                return 1
    finally:
        cluster.stop()
    return 0


def _broker_stop(args: argparse.Namespace) -> int:
    from jobwheel.deploy.broker import LocalCluster

    broker = _broker(args)
    if isinstance(broker, LocalCluster):
        if args.node is not None:
            stopped = broker.stop_node(args.node)
            print(f"node {args.node} {'stopped' if stopped else 'was not running'}")
            return 0
        nodes = broker.stop()
        shown = ", ".join(map(str, nodes)) or "none was running"
        print(f"cluster stopped (nodes: {shown}; data dir {broker.data_dir})")
        return 0
    if broker.stop():
        print(f"broker stopped (data dir {broker.data_dir})")
    else:
        print(f"no broker running for data dir {broker.data_dir}")
    return 0


def _broker_status(args: argparse.Namespace) -> int:
    """Exit 0 when the broker (every node) runs, 3 when none does, 1 for a partial cluster."""
    from jobwheel.deploy.broker import ClusterStatus

    status = _broker(args).status()
    print(status.describe())
    if isinstance(status, ClusterStatus):
        if status.running == len(status.nodes):
            return 0
        return 3 if status.running == 0 else 1
    return 0 if status.running else 3


def _topics_ensure(args: argparse.Namespace) -> int:
    from jobwheel.kafka.admin import ensure_topics, topics_summary
    from jobwheel.reach import require_reachable

    settings = get_settings()
    require_reachable(settings.bootstrap_servers)
    created = ensure_topics(settings)
    for name in created:
        print(f"created {name}")
    print(
        f"{topics_summary(settings, created)}; {settings.partitions} partitions each (the "
        f"workers roster {settings.topics.workers}: one), bootstrap {settings.bootstrap_servers}"
    )
    return 0


def _acls_apply(args: argparse.Namespace) -> int:
    from jobwheel.deploy.acls import ROLES, apply_acls

    settings = get_settings()
    out = args.out or settings.kafka_credentials_dir or settings.data_dir / "kafka-credentials"
    passwords = {k: v.get_secret_value() for k, v in settings.kafka_role_passwords.items()}
    applied = apply_acls(
        settings, roles=args.roles or ROLES, credentials_dir=out, passwords=passwords
    )
    for a in applied:
        revoked = f", {a.revoked} revoked" if a.revoked else ""
        print(f"{a.role:<10} {a.principal:<28} {a.granted} ACLs{revoked}  {a.credentials_path}")
    print(
        "give each process its role: "
        f'JOBWHEEL_KAFKA_CONFIG="$(cat {out}/<role>.json)" (e.g. worker.json for `jobwheel worker`)'
    )
    return 0


def _acls_show(args: argparse.Namespace) -> int:
    from jobwheel.deploy.acls import ROLES, role_grants, username

    settings = get_settings()
    for role in ROLES:
        print(f"{role} (User:{username(settings, role)})")
        for g in role_grants(settings, role):
            name = f"{g.name}*" if g.prefixed else g.name
            print(f"  {g.resource:<16} {name:<40} {', '.join(g.operations)}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from jobwheel import extras
    from jobwheel.deploy.stack import Stack

    extras.require("all")  # before a broker is started for services that could not run

    stack = Stack(
        get_settings(),
        data_dir=args.data_dir,
        port=args.port,
        controller_port=args.controller_port,
        bootstrap=args.bootstrap,
        tasks=args.tasks,
        nodes=args.nodes,
        secure=args.secure,
    )
    return stack.run(_stop_event(again=stack.ask_again))


def _stop_event(again: Callable[[], None] | None = None) -> threading.Event:
    """An event set by SIGINT/SIGTERM, so the handler can shut things down in order; later
    signals call ``again`` (``jobwheel up``: hurry the services, then kill them). Both from
    the signals' own thread (:mod:`jobwheel.signals`), never inside the main thread's wait on
    an event."""
    stop = threading.Event()

    def handle(signum: int) -> None:
        if stop.is_set() and again is not None:
            again()
        stop.set()

    on_signals((signal.SIGINT, signal.SIGTERM), handle)
    return stop
