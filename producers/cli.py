"""Subcommands of the ``jobwheel`` CLI that belong to ``producers``: ``submit``.

The job-control commands (cancel, pause, resume, trigger) live with the status commands
(:mod:`jobwheel.consumers.status.cli`): after sending they wait for the scheduler's answer, which is
read from the status store.

The options are the fields of :class:`~jobwheel.producers.spec.JobSpec` (one definition for the
SDK, this command and the API), taken as text and converted by :mod:`jobwheel.producers.spec`
(then checked by the contract's rules, :mod:`jobwheel.schemas.validation`), not by argparse
types, so every bad value ends as one ``ValidationError`` naming the field (exit 2, one line,
nothing sent) instead of argparse's usage dump.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NoReturn


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this package's subcommands; each sets ``handler=`` to a function of the args."""
    p = sub.add_parser(
        "submit",
        help="schedule a job; prints its id",
        description="Schedule a job. Give exactly one of --now, --in, --at, --every, --cron. "
        "DURATION is like 250ms, 5s, 10m, 1h30m, 2d, 1w; ISO8601 has an offset or Z.",
    )
    from jobwheel.producers.spec import OPTIONS, cli_name

    for option in OPTIONS:  # the options of JobSpec, one definition for SDK, CLI and API
        meta = option.metadata
        how: dict[str, Any] = {"dest": option.name, "help": meta["help"]}
        if meta["form"] == "flag":
            how["action"] = "store_true"
        else:
            how["metavar"] = meta["metavar"]
        p.add_argument(cli_name(option), **how)
    p.add_argument(
        "--require-worker",
        action="store_true",
        help="refuse (exit 2, nothing sent) when no live worker serves the task; without it "
        "that is a warning on stderr and the job is sent",
    )
    p.set_defaults(handler=submit)
    one_line_errors(p, "submit")


def one_line_errors(parser: argparse.ArgumentParser, command: str) -> None:
    """argparse's own errors (unknown option, missing value) as one line too, exit 2."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"jobwheel {command}: {message} (see jobwheel {command} --help)\n")

    parse_known_args = parser.parse_known_args

    def strict(args: Any = None, namespace: Any = None) -> Any:
        # Extra words would otherwise reach the top-level parser and its multi-line usage.
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = strict  # type: ignore[method-assign]


def spec_from_args(args: argparse.Namespace, max_args_bytes: int | None = None) -> Any:
    """The :class:`JobSpec` of ``jobwheel submit`` options (ValidationError on bad input)."""
    from jobwheel.producers.spec import SCHEDULE_KEYS, spec_from_text
    from jobwheel.schemas import validation as rules

    options = {name: getattr(args, name, None) for name in SCHEDULE_KEYS}
    options["now"] = options["now"] or None  # absent flag: the default
    return spec_from_text(
        options,
        max_args_bytes=rules.DEFAULT_MAX_ARGS_BYTES if max_args_bytes is None else max_args_bytes,
        args_as_text=True,
    )


def submit(args: argparse.Namespace) -> int:
    """Send the job; a task no live worker serves (by the workers topic) is a warning line on
    stderr, or with ``--require-worker`` a refusal before anything is sent."""
    import sys

    from jobwheel.clock import SystemClock
    from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister
    from jobwheel.producers.client import JobClient
    from jobwheel.producers.spec import build_schedule
    from jobwheel.settings import get_settings

    settings = get_settings()
    # Everything is validated before a producer exists: a bad request sends nothing.
    command = build_schedule(
        spec_from_args(args, settings.max_args_bytes),
        now_ms=SystemClock().now_ms(),
        max_args_bytes=settings.max_args_bytes,
        # JOBWHEEL_QUEUES and the queues added at run time (the broker's runs topics): when
        # the broker cannot be asked, the connection check below says so.
        queues=QueueDirectory(
            settings, admin_topic_lister(settings, "jobwheel.producers"), benefit_of_doubt=True
        ),
    )
    check = "refuse" if args.require_worker else "warn"
    with JobClient(settings, task_check=check) as client:
        client.check_broker()  # a broker that is down is one line now, not in 30 s
        # Issued when sent: `--now` and `--in` count from here, not from before the connection
        # was made (which would make a --now run look a connection set-up late).
        problems = client.send_checked(
            dataclasses.replace(command, issued_at_ms=SystemClock().now_ms())
        )
    for problem in problems:
        print(f"jobwheel submit: warning: {problem}", file=sys.stderr)
    print(command.job_id)
    return 0
