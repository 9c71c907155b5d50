"""The rules of the wire contract for a complete :class:`JobCommand`, as one pure function.

Whoever builds a command (the SDK, the CLI, the HTTP API) and whoever applies one (the
scheduler) uses these same functions, so "valid" means one thing on both sides of the requests
topic: a command the SDK refuses is also refused when a service writes it to the topic by hand,
and the scheduler answers it with REJECTED instead of scheduling it.

Every failure is a :class:`jobwheel.errors.ValidationError` whose ``field`` is the user-facing
name (``job_id``, ``task``, ``args``, ``at``, ``in``, ``every``, ``cron``, ``timezone``,
``max_attempts``, ``timeout``, ...) and whose message quotes the bad value cut to its first 60
characters (:func:`jobwheel.errors.clip`). Nothing else escapes: not ``RecursionError`` for a
deeply nested document, not ``OverflowError`` for a huge number, not ``UnicodeEncodeError``.

The rules are deterministic for a given command: "now" is an argument, and the scheduler passes
``now_ms=command.issued_at_ms``, so a command replayed from the topic a week later gets the same
verdict it got the first time. Past instants: an ``at`` up to :data:`MAX_PAST_MS` (1 hour)
before ``now_ms`` is accepted and fires immediately (clock skew, a slow retry); anything older is
almost certainly a wrong date or zone and is refused.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

try:  # the scheduler's extra has it (check_args_text); a client install checks without it
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by the client-install test
    _orjson = None

from jobwheel.errors import ValidationError, clip
from jobwheel.schemas.cron import parse_cron, zone
from jobwheel.schemas.models import (
    After,
    At,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    Every,
    JobCommand,
    Now,
    PauseJob,
    ReplayRun,
    ResumeJob,
    ScheduleJob,
    Trigger,
    TriggerJob,
)

TASK_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}", re.ASCII)
#: A queue names a topic (``<prefix>.runs.<queue>``, :func:`jobwheel.schemas.topics.runs_topic`)
#: and a consumer group: the characters Kafka allows in a topic name, and a length that leaves
#: room for any prefix within Kafka's 249.
MAX_QUEUE_CHARS = 64
QUEUE_RE = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_QUEUE_CHARS}}}", re.ASCII)
MAX_ID_CHARS = 200
MAX_REASON_CHARS = 10_000
MAX_PAST_MS = 3_600_000
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: The largest duration in milliseconds (half of Int64, so ``issued_at + delay`` cannot overflow).
MAX_DURATION_MS = INT64_MAX // 2
#: 9999-12-31T23:59:59.999Z: instants past it cannot be shown as dates anywhere.
MAX_EPOCH_MS = 253_402_300_799_999
#: Arrays/objects nested deeper than this are refused before parsing: a parser that recurses
#: (Python's, the worker's) would otherwise fail with RecursionError at a depth that depends on
#: its own stack, so the verdict would not be the same everywhere.
MAX_ARGS_DEPTH = 64
DEFAULT_MAX_ARGS_BYTES = 64 * 1024
#: The shortest ``every`` interval: one job's fires, its run records and its MISSED events when
#: it falls behind all scale with 1/interval, and ``every 1ms`` made one job flood the topics
#: with ~600 runs a second. A finer cadence is a loop inside one run, not a schedule.
MIN_EVERY_MS = 1000


def job_id(value: Any, field: str = "job_id") -> str:
    """1..200 characters, none of them whitespace or control characters (it is the record key
    and appears in URLs, logs and run ids)."""
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise ValidationError(
            field, f"must be 1..{MAX_ID_CHARS} characters, got {len(value)}: {clip(value)}"
        )
    # The common case in one C-level check: printable ASCII has no whitespace but the space.
    if value.isascii() and value.isprintable() and " " not in value:
        return value
    for ch in value:
        if ch.isspace() or not ch.isprintable():
            raise ValidationError(
                field, f"{clip(value)} contains whitespace or a control character ({ch!r})"
            )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(field, f"{clip(value)} is not valid Unicode text") from exc
    return value


#: A run id is its job id, ``@``, and a suffix the scheduler chose (``1767225600000``,
#: ``trigger-1767225600000``): at most this many characters after the ``@``.
MAX_RUN_SUFFIX_CHARS = 40


def run_id(value: Any, of_job: str) -> str:
    """A run id of the job ``of_job``: ``<job_id>@<suffix>`` as the scheduler makes them (the
    replay of a dead run names it so; a run id of another job would replay into this one)."""
    if not isinstance(value, str):
        raise ValidationError("run_id", f"must be a string, got {type(value).__name__}")
    prefix = f"{of_job}@"
    suffix = value[len(prefix) :]
    if not value.startswith(prefix) or not 1 <= len(suffix) <= MAX_RUN_SUFFIX_CHARS:
        raise ValidationError(
            "run_id",
            f"{clip(value)} is not a run id of job {clip(of_job)}: expected "
            f"'{clip(of_job)}@' and 1..{MAX_RUN_SUFFIX_CHARS} more characters",
        )
    if not (suffix.isascii() and suffix.isprintable()) or " " in suffix:
        raise ValidationError("run_id", f"{clip(value)} has an unexpected character after '@'")
    return value


def task(value: Any) -> str:
    """Task names are registry keys: letters, digits, ``_ . : -``; 1..200 characters."""
    if not isinstance(value, str) or TASK_RE.fullmatch(value) is None:
        raise ValidationError(
            "task",
            f"{clip(value)} is not a task name; use 1..200 letters, digits, '_', '.', ':' or '-' "
            "(e.g. 'billing.send_invoice')",
        )
    return value


def queue(value: Any) -> str:
    """Queue names become topic names: letters, digits, ``. _ -``; 1..64 characters, and not
    ``.`` or ``..`` (Kafka refuses those as names)."""
    if not isinstance(value, str) or QUEUE_RE.fullmatch(value) is None or value.strip(".") == "":
        raise ValidationError(
            "queue",
            f"{clip(value)} is not a queue name; use 1..{MAX_QUEUE_CHARS} letters, digits, "
            "'.', '_' or '-' (e.g. 'reports')",
        )
    return value


def _too_big(size: int, max_bytes: int) -> ValidationError:
    return ValidationError(
        "args",
        f"{size} bytes of JSON, over the {max_bytes}-byte limit (JOBWHEEL_MAX_ARGS_BYTES); "
        "pass a reference (id, URL) instead of the data",
    )


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValidationError("args", "contains a lone surrogate; not valid Unicode text") from exc


def value_depth(value: Any, limit: int = MAX_ARGS_DEPTH) -> int:
    """How deeply lists and dicts nest in ``value`` (level by level, no recursion; stops
    counting once past ``limit``)."""
    level, depth = [value], 0
    while True:
        level = [v for v in level if isinstance(v, dict | list)]
        if not level or depth > limit:
            return depth
        depth += 1
        children: list[Any] = []
        for v in level:
            children.extend(v.values() if isinstance(v, dict) else v)
        level = children


def _check_depth(value: Any, text: str, field: str) -> None:
    if text.count("[") + text.count("{") <= MAX_ARGS_DEPTH:  # cannot nest deeper: skip the walk
        return
    if value_depth(value) > MAX_ARGS_DEPTH:
        raise ValidationError(
            field, f"nested more than {MAX_ARGS_DEPTH} levels deep (arrays/objects); flatten it"
        )


def args_json(args: Any, max_bytes: int) -> str:
    """``args`` as compact JSON text, refusing values JSON cannot carry and oversized payloads.

    ``None`` means no arguments (``{}``). The worker calls the task with an object's items as
    keyword arguments, a list's items as positional ones, any other value as the one argument.
    """
    if args is None:
        return "{}"
    try:
        text = json.dumps(args, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError as exc:
        raise ValidationError(
            "args", f"nested more than {MAX_ARGS_DEPTH} levels deep (arrays/objects); flatten it"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise ValidationError("args", f"not JSON-serializable: {clip(str(exc))}") from exc
    size = _utf8_size(text)
    if size > max_bytes:
        raise _too_big(size, max_bytes)
    _check_depth(args, text, "args")
    return text


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_args_text(text: Any, max_bytes: int, field: str = "args") -> Any:
    """A JSON document given as text (the CLI's ``--args``, a raw command's ``args_json``),
    checked and parsed.

    The size limit applies to the text as given (that is what travels and is stored), before
    it is parsed. A document nested more deeply than :data:`MAX_ARGS_DEPTH` is refused whether
    the parser gives up on it (``RecursionError``, a few hundred levels down) or not, so the
    verdict does not depend on the caller's stack.
    """
    if not isinstance(text, str):
        raise ValidationError(field, f"must be JSON text, got {type(text).__name__}")
    size = _utf8_size(text)
    if size > max_bytes:
        raise _too_big(size, max_bytes)
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except RecursionError as exc:
        raise ValidationError(
            field, f"nested more than {MAX_ARGS_DEPTH} levels deep (arrays/objects); flatten it"
        ) from exc
    except ValueError as exc:
        raise ValidationError(field, f"not valid JSON: {clip(str(exc))}") from exc
    _check_depth(value, text, field)
    if _SURROGATE_ESCAPE.search(text):  # "\ud800" alone parses, but is no Unicode text
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValidationError(field, "contains a lone surrogate; not valid Unicode") from exc
    return value


def check_args_text(text: Any, max_bytes: int, field: str = "args") -> None:
    """:func:`parse_args_text`'s verdict without its value (the scheduler checks every
    command's arguments and never reads them), at a fifth of the cost for valid text.

    orjson reads first, and what it accepts the standard parser accepts too: where the two
    differ, orjson is the one that refuses (NaN, a number too large for a double, a lone
    surrogate escape, a BOM, more than 1,024 levels). A text it refuses goes through
    :func:`parse_args_text`, so the verdict and its message are that function's; the depth rule
    applies on both paths. The value is not used because orjson reads integers beyond 64 bits
    as floats where the standard parser keeps them exact. Without orjson (a client install,
    which has no scheduler extra) it is :func:`parse_args_text`.
    """
    if _orjson is not None and type(text) is str and len(text) <= max_bytes // 4:  # <= 4n bytes
        try:
            value = _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
        else:
            _check_depth(value, text, field)
            return
    parse_args_text(text, max_bytes, field)


def args_text(text: Any, max_bytes: int, field: str = "args") -> str:
    """:func:`parse_args_text`, returned as compact JSON text."""
    return args_json(parse_args_text(text, max_bytes, field), max_bytes)


def positive_ms(value: Any, field: str, *, allow_none: bool = False) -> int | None:
    """A duration (timedelta, or int milliseconds) as whole milliseconds > 0."""
    if value is None:
        if allow_none:
            return None
        raise ValidationError(field, "is required")
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ValidationError(
            field, f"must be a timedelta (or int milliseconds), got {type(value).__name__}"
        )
    if ms <= 0:
        raise ValidationError(field, f"must be positive (at least 1 ms), got {clip(value)}")
    if ms > MAX_DURATION_MS:
        raise ValidationError(field, f"{clip(value)} is too large (at most {MAX_DURATION_MS} ms)")
    return ms


def every_ms(value: Any) -> int:
    """An ``every`` interval (timedelta, or int milliseconds): :func:`positive_ms`, and at
    least :data:`MIN_EVERY_MS`."""
    ms = positive_ms(value, "every")
    assert ms is not None
    if ms < MIN_EVERY_MS:
        raise ValidationError(
            "every",
            f"{ms} ms is shorter than the shortest interval, {MIN_EVERY_MS} ms (1s); "
            "for a finer cadence, loop inside one run",
        )
    return ms


def epoch_ms(value: Any, field: str) -> int:
    """An instant in epoch milliseconds, between 1970 and the end of year 9999."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EPOCH_MS:
        raise ValidationError(
            field,
            f"must be epoch milliseconds between 0 and {MAX_EPOCH_MS} (year 9999), "
            f"got {clip(value)}",
        )
    return value


def not_too_old(at_ms: int, now_ms: int, field: str = "at") -> int:
    """Slightly past instants fire immediately; more than :data:`MAX_PAST_MS` ago is refused."""
    if at_ms < now_ms - MAX_PAST_MS:
        from jobwheel.schemas.timetext import duration_text  # timetext imports this module

        raise ValidationError(
            field,
            f"is {duration_text(now_ms - at_ms)} in the past (more than "
            f"{duration_text(MAX_PAST_MS)} ago); check the date and its time zone, or schedule "
            "it to run now instead",
        )
    return at_ms


def concurrency_policy(value: Any) -> ConcurrencyPolicy:
    if isinstance(value, ConcurrencyPolicy):
        return value
    if isinstance(value, str):
        try:
            return ConcurrencyPolicy(value.upper())
        except ValueError:
            pass
    raise ValidationError(
        "concurrency_policy",
        f"{clip(value)} is not one of {', '.join(p.value for p in ConcurrencyPolicy)}",
    )


def max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
        raise ValidationError(
            "max_attempts", f"must be an integer from 1 to {INT32_MAX}, got {clip(value)}"
        )
    return value


def optional_text(value: Any, field: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise ValidationError(field, f"is {len(value)} characters; at most {max_chars}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(field, f"{clip(value)} is not valid Unicode text") from exc
    return value


def idempotency_key(value: Any) -> str | None:
    if value is None:
        return None
    return job_id(value, field="idempotency_key")


def cron(expression: Any, timezone: Any) -> Cron:
    if not isinstance(timezone, str):
        raise ValidationError(
            "timezone", f"must be an IANA zone name, got {type(timezone).__name__}"
        )
    parse_cron(expression)
    zone(timezone)
    return Cron(expression, timezone)


# --- whole commands (the scheduler's gate, the client's final check) ------------------------


def check_trigger(t: Any, issued_at_ms: int) -> Trigger:
    if isinstance(t, Now):
        return t
    if isinstance(t, At):
        return At(not_too_old(epoch_ms(t.at_ms, "at"), issued_at_ms))
    if isinstance(t, After):
        positive_ms(_long(t.delay_ms, "in"), "in")
        return t
    if isinstance(t, Every):
        every_ms(_long(t.interval_ms, "every"))
        if t.start_at_ms is not None:
            not_too_old(epoch_ms(t.start_at_ms, "start_at"), issued_at_ms, "start_at")
        return t
    if isinstance(t, Cron):
        return cron(t.expression, t.timezone)
    raise ValidationError("trigger", f"unsupported trigger {clip(t)}")


def check_command(command: JobCommand, *, now_ms: int, max_args_bytes: int) -> JobCommand:
    """Every rule above, applied to a complete command. Returns it unchanged if valid.

    The scheduler calls it with ``now_ms=command.issued_at_ms`` (so the verdict is the same on
    every replay); the SDK with its clock.
    """
    if not isinstance(command, JobCommand):
        raise ValidationError("command", f"expected a JobCommand, got {type(command).__name__}")
    job_id(command.job_id)
    job_id(command.command_id, field="command_id")
    epoch_ms(command.issued_at_ms, "issued_at_ms")
    body = command.body
    if isinstance(body, ScheduleJob):
        task(body.task)
        check_args_text(body.args_json, max_args_bytes)
        check_trigger(body.trigger, now_ms)
        max_attempts(body.max_attempts)
        positive_ms(_long(body.timeout_ms, "timeout", allow_none=True), "timeout", allow_none=True)
        positive_ms(_long(body.visibility_timeout_ms, "visibility_timeout"), "visibility_timeout")
        positive_ms(
            _long(body.starting_deadline_ms, "starting_deadline", allow_none=True),
            "starting_deadline",
            allow_none=True,
        )
        concurrency_policy(body.concurrency_policy)
        idempotency_key(body.idempotency_key)
        queue(body.queue)
    elif isinstance(body, CancelJob | PauseJob | ResumeJob | TriggerJob):
        optional_text(body.reason, "reason", MAX_REASON_CHARS)
    elif isinstance(body, ReplayRun):
        run_id(body.run_id, command.job_id)
        epoch_ms(body.scheduled_time_ms, "scheduled_time_ms")
        if isinstance(body.attempt, bool) or not isinstance(body.attempt, int):
            raise ValidationError("attempt", f"must be an integer, got {clip(body.attempt)}")
        if not 1 <= body.attempt < INT32_MAX // 2:
            raise ValidationError("attempt", f"must be from 1 to {INT32_MAX // 2 - 1}")
        task(body.task)
        check_args_text(body.args_json, max_args_bytes)
        max_attempts(body.max_attempts)
        positive_ms(_long(body.timeout_ms, "timeout", allow_none=True), "timeout", allow_none=True)
        positive_ms(_long(body.visibility_timeout_ms, "visibility_timeout"), "visibility_timeout")
        optional_text(body.reason, "reason", MAX_REASON_CHARS)
        queue(body.queue)
    else:
        raise ValidationError("body", f"unsupported command {clip(body)}")
    return command


def check_key(key: bytes | None, command: JobCommand) -> None:
    """The record key must be the job id's UTF-8 bytes: the partition (and so the scheduler
    that owns the job) is chosen by the key, while the job id inside decides which job the
    command changes. A record whose two disagree would change a job from the wrong partition."""
    if key is None:
        raise ValidationError("key", "is missing; key every command by its job id (UTF-8 bytes)")
    expected = job_id(command.job_id).encode("utf-8")
    if key != expected:
        raise ValidationError(
            "key",
            f"{clip(bytes(key))} is not the job id {clip(command.job_id)} as UTF-8 bytes; key "
            "every command by its job id",
        )


def _long(value: Any, field: str, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > INT64_MAX:
        raise ValidationError(field, f"must be an integer (milliseconds), got {clip(value)}")
    return value
