"""Subcommands of the ``jobwheel`` CLI that belong to ``producers``: ``submit``.

The job-control commands (cancel, pause, resume, trigger) live with the status commands
(:mod:`jobwheel.consumers.status.cli`): after sending they wait for the scheduler's answer, which is
read from the status store.

Options are taken as text and converted by :mod:`jobwheel.producers.validation` (then checked by the
contract's rules, :mod:`jobwheel.schemas.validation`), not by argparse types,
so every bad value ends as one ``ValidationError`` naming the field (exit 2, one line, nothing
sent) instead of argparse's usage dump.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, NoReturn


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this package's subcommands; each sets ``handler=`` to a function of the args."""
    p = sub.add_parser(
        "submit",
        help="schedule a job; prints its id",
        description="Schedule a job. Give exactly one of --now, --in, --at, --every, --cron. "
        "DURATION is like 250ms, 5s, 10m, 1h30m, 2d.",
    )
    p.add_argument("--task", help="registered task name, e.g. demo.echo (required)")
    p.add_argument("--args", metavar="JSON", help="task arguments as JSON (object: kwargs)")
    p.add_argument("--id", dest="job_id", metavar="JOB_ID", help="job id (default: a new uuid)")
    p.add_argument("--now", action="store_true", help="run once, now")
    p.add_argument("--in", dest="in_", metavar="DURATION", help="run once after DURATION")
    p.add_argument("--at", metavar="ISO8601", help="run once at a time with offset or Z")
    p.add_argument("--every", metavar="DURATION", help="run every DURATION")
    p.add_argument("--start-at", metavar="ISO8601", help="first fire of --every")
    p.add_argument("--cron", metavar="EXPR", help="five-field cron expression")
    p.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA zone of --cron (UTC)")
    p.add_argument("--max-attempts", metavar="N", help="attempts per run (default 3)")
    p.add_argument("--timeout", metavar="DURATION", help="per-attempt time limit")
    p.add_argument(
        "--visibility-timeout", metavar="DURATION", help="redeliver after this (default 30s)"
    )
    p.add_argument(
        "--starting-deadline", metavar="DURATION", help="a fire later than this is MISSED"
    )
    p.add_argument("--concurrency-policy", metavar="ALLOW|FORBID|REPLACE", help="default ALLOW")
    p.add_argument("--idempotency-key", metavar="K", help="apply commands with K once")
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
    from jobwheel.errors import ValidationError, clip
    from jobwheel.producers import validation as v
    from jobwheel.producers.client import DEFAULT_VISIBILITY_TIMEOUT, JobSpec
    from jobwheel.schemas import validation as rules

    if max_args_bytes is None:
        max_args_bytes = rules.DEFAULT_MAX_ARGS_BYTES

    if not args.task:
        raise ValidationError("task", "is required (--task NAME, e.g. --task demo.echo)")
    task_args = None
    if args.args is not None:
        # the size is checked on the text, before parsing; a deep document cannot crash it
        task_args = rules.parse_args_text(args.args, max_args_bytes)
    max_attempts: Any = 3
    if args.max_attempts is not None:
        text = args.max_attempts.strip()
        if not re.fullmatch(r"[0-9]{1,10}", text, re.ASCII):
            raise ValidationError(
                "max_attempts", f"{clip(args.max_attempts)} is not a whole number from 1"
            )
        max_attempts = int(text)

    def duration(text: str | None, field: str) -> Any:
        return None if text is None else v.parse_duration(text, field)

    return JobSpec(
        task=args.task,
        job_id=args.job_id,
        args=task_args,
        now=args.now,
        in_=duration(args.in_, "in"),
        at=None if args.at is None else v.parse_instant(args.at, "at"),
        every=duration(args.every, "every"),
        start_at=None if args.start_at is None else v.parse_instant(args.start_at, "start_at"),
        cron=args.cron,
        tz=args.tz,
        max_attempts=max_attempts,
        timeout=duration(args.timeout, "timeout"),
        visibility_timeout=duration(args.visibility_timeout, "visibility_timeout")
        or DEFAULT_VISIBILITY_TIMEOUT,
        starting_deadline=duration(args.starting_deadline, "starting_deadline"),
        concurrency_policy=args.concurrency_policy or "ALLOW",
        idempotency_key=args.idempotency_key,
    )


def submit(args: argparse.Namespace) -> int:
    from jobwheel.clock import SystemClock
    from jobwheel.producers.client import JobClient, build_schedule
    from jobwheel.settings import get_settings

    settings = get_settings()
    # Everything is validated before a producer exists: a bad request sends nothing.
    command = build_schedule(
        spec_from_args(args, settings.max_args_bytes),
        now_ms=SystemClock().now_ms(),
        max_args_bytes=settings.max_args_bytes,
    )
    with JobClient(settings) as client:
        client.check_broker()  # a broker that is down is one line now, not in 30 s
        # Issued when sent: `--now` and `--in` count from here, not from before the connection
        # was made (which would make a --now run look a connection set-up late).
        client.send(dataclasses.replace(command, issued_at_ms=SystemClock().now_ms()))
    print(command.job_id)
    return 0
