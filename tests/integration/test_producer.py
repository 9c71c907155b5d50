"""The SDK against a real broker: what a service sends is what the scheduler will read.

Each command is consumed back from the requests topic and decoded; its partition (chosen by
librdkafka's murmur2 partitioner) must be the one the scheduler assigns to the job id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from jobwheel.clock import ManualClock
from jobwheel.errors import DeliveryError, ValidationError
from jobwheel.producers.client import AsyncJobClient, JobClient, JobSpec
from jobwheel.schemas.codec import default_codec
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
    ResumeJob,
    ScheduleJob,
    TriggerJob,
)
from jobwheel.schemas.partitioning import partition_for
from tests.support import consume, read_all, scaled, wait_until

# Every client here runs on ManualClock(NOW_MS), and no scheduler reads these commands.
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # fixed date: a ManualClock's
NOW_MS = int(NOW.timestamp() * 1000)


def _decoded(settings: Any, count: int, timeout_s: float = 30.0) -> list[tuple[Any, JobCommand]]:
    msgs = consume(settings, settings.topics.requests, min_count=count, timeout_s=timeout_s)
    return [(m, default_codec().decode(m.value())) for m in msgs]


def _assert_partitioned(settings: Any, msg: Any, command: JobCommand) -> None:
    n = settings.partitions
    assert msg.key() == command.job_id.encode("utf-8")
    assert msg.partition() == partition_for(command.job_id, n)


def _expected_bodies() -> list[tuple[str, dict[str, Any], Any]]:
    """(job id, schedule kwargs, expected body) for every trigger type and option."""
    return [
        ("job-now", {"now": True}, ScheduleJob("demo.echo", Now())),
        ("job-in", {"in_": timedelta(seconds=5)}, ScheduleJob("demo.echo", After(5000))),
        (
            "job-at",
            {"at": NOW + timedelta(minutes=1)},
            ScheduleJob("demo.echo", At(NOW_MS + 60_000)),
        ),
        (
            "job-every",
            {"every": timedelta(seconds=2), "start_at": NOW + timedelta(seconds=10)},
            ScheduleJob("demo.echo", Every(2000, NOW_MS + 10_000)),
        ),
        (
            "job-cron-ü",
            {
                "cron": "30 2 * * *",
                "tz": "America/New_York",
                "args": {"x": [1, "ü"]},
                "max_attempts": 5,
                "timeout": timedelta(seconds=9),
                "visibility_timeout": timedelta(seconds=4),
                "starting_deadline": timedelta(minutes=1),
                "concurrency_policy": "REPLACE",
                "idempotency_key": "idem-1",
            },
            ScheduleJob(
                "demo.echo",
                Cron("30 2 * * *", "America/New_York"),
                args_json='{"x":[1,"ü"]}',
                max_attempts=5,
                timeout_ms=9000,
                visibility_timeout_ms=4000,
                starting_deadline_ms=60_000,
                concurrency_policy=ConcurrencyPolicy.REPLACE,
                idempotency_key="idem-1",
            ),
        ),
    ]


CONTROLS = [
    ("cancel", CancelJob("done")),
    ("pause", PauseJob("done")),
    ("resume", ResumeJob("done")),
    ("trigger", TriggerJob("done")),
]


def _check_round_trip(settings: Any, returned: dict[str, str]) -> None:
    expected = _expected_bodies()
    total = len(expected) + len(CONTROLS)
    got = _decoded(settings, total)
    assert len(got) == total
    by_job: dict[str, list[tuple[Any, JobCommand]]] = {}
    for msg, command in got:
        by_job.setdefault(command.job_id, []).append((msg, command))
        _assert_partitioned(settings, msg, command)
        assert command.issued_at_ms == NOW_MS
    assert len({c.command_id for _, c in got}) == total
    for job_id, _, body in expected:
        ((_, command),) = [x for x in by_job[job_id] if isinstance(x[1].body, ScheduleJob)]
        assert command == JobCommand(command.command_id, job_id, NOW_MS, body)
    # Control commands all went to job-now, in order, after its schedule (one partition).
    bodies = [c.body for _, c in by_job["job-now"]]
    assert bodies == [ScheduleJob("demo.echo", Now())] + [b for _, b in CONTROLS]
    for kind, _ in CONTROLS:
        assert returned[kind] in {c.command_id for _, c in by_job["job-now"]}


def test_sync_client_commands_arrive_decodable_in_the_right_partition(settings: Any) -> None:
    returned: dict[str, str] = {}
    with JobClient(settings, clock=ManualClock(NOW_MS)) as client:
        for job_id, kwargs, _ in _expected_bodies():
            assert client.schedule(job_id, task="demo.echo", **kwargs) == job_id
        for kind, _ in CONTROLS:
            returned[kind] = getattr(client, kind)("job-now", reason="done")
    _check_round_trip(settings, returned)


def test_async_client_commands_arrive_decodable_in_the_right_partition(settings: Any) -> None:
    async def main() -> dict[str, str]:
        returned: dict[str, str] = {}
        async with AsyncJobClient(settings, clock=ManualClock(NOW_MS)) as client:
            for job_id, kwargs, _ in _expected_bodies():
                assert await client.schedule(job_id, task="demo.echo", **kwargs) == job_id
            for kind, _ in CONTROLS:
                returned[kind] = await getattr(client, kind)("job-now", reason="done")
        return returned

    _check_round_trip(settings, asyncio.run(main()))


class _SlowBuild(ManualClock):
    """A clock whose first reading is the batch's issue time and whose later ones are 3 s on:
    building, checking and encoding the batch took that long before the first was sent."""

    def __init__(self, start_ms: int) -> None:
        super().__init__(start_ms)
        self.readings = 0

    def now_ms(self) -> int:
        self.readings += 1
        return super().now_ms() + (0 if self.readings == 1 else 3000)


def test_a_command_sent_long_after_it_was_issued_is_issued_again_as_it_is_sent(
    settings: Any,
) -> None:
    """A command that waited more than REISSUE_AFTER_MS between its issue and its send goes out
    issued as it is sent: the scheduler would otherwise hold its issue time to the record's
    broker time and warn of a wrong clock (a schedule_many of 50,000 takes seconds before its
    first send). Its trigger then counts from the send. One sent at once keeps its time."""
    specs = [
        JobSpec(job_id=f"slow-{i}", task="demo.echo", in_=timedelta(seconds=5)) for i in range(3)
    ]
    with JobClient(settings, clock=ManualClock(NOW_MS)) as client:
        client.schedule_many([JobSpec(job_id="prompt", task="demo.echo", in_=timedelta(seconds=5))])
    with JobClient(settings, clock=_SlowBuild(NOW_MS)) as client:
        client.schedule_many(specs)

    async def main() -> None:
        async with AsyncJobClient(settings, clock=_SlowBuild(NOW_MS)) as client:
            await client.schedule_many([dataclasses.replace(specs[0], job_id="slow-async")])

    asyncio.run(main())
    issued = {c.job_id: (c.issued_at_ms, c.body) for _, c in _decoded(settings, 5)}
    assert issued["prompt"] == (NOW_MS, ScheduleJob("demo.echo", After(5000)))
    for job_id in ("slow-0", "slow-1", "slow-2", "slow-async"):
        assert issued[job_id] == (NOW_MS + 3000, ScheduleJob("demo.echo", After(5000)))


def test_batch_lands_every_job_in_its_murmur2_partition(settings: Any) -> None:
    specs = [JobSpec(task="demo.echo", in_=timedelta(seconds=i + 1)) for i in range(300)]
    specs[0] = dataclasses.replace(specs[0], job_id="fixed-id")
    with JobClient(settings) as client:
        ids = client.schedule_many(specs)
    assert ids[0] == "fixed-id" and len(set(ids)) == 300
    got = _decoded(settings, 300)
    assert sorted(c.job_id for _, c in got) == sorted(ids)
    for msg, command in got:
        _assert_partitioned(settings, msg, command)
    assert {m.partition() for m, _ in got} == set(range(settings.partitions))
    delay = {c.job_id: c.body.trigger.delay_ms for _, c in got}  # type: ignore[union-attr]
    assert [delay[j] for j in ids] == [(i + 1) * 1000 for i in range(300)]


def test_async_batch_and_concurrent_schedules(settings: Any) -> None:
    async def main() -> list[str]:
        async with AsyncJobClient(settings) as client:
            batch = await client.schedule_many(
                [{"task": "demo.echo", "now": True} for _ in range(50)]
            )
            single = await asyncio.gather(
                *(client.schedule(task="demo.echo", in_=timedelta(seconds=1)) for _ in range(50))
            )
            return batch + list(single)

    ids = asyncio.run(main())
    got = _decoded(settings, 100)
    assert sorted(c.job_id for _, c in got) == sorted(ids)


def test_invalid_batch_sends_nothing(settings: Any) -> None:
    specs = [JobSpec(task="demo.echo", now=True), JobSpec(task="bad task", now=True)]
    with JobClient(settings) as client, pytest.raises(ValidationError) as info:
        client.schedule_many(specs)
    assert info.value.field == "task"
    leaked = read_all(settings, settings.topics.requests)
    assert leaked == [], [default_codec().decode(m.value()) for m in leaked]


def _limit_message_size(settings: Any, max_bytes: int) -> None:
    admin = AdminClient(settings.librdkafka())
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        settings.topics.requests,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(max_bytes), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    # The controller has accepted the limit; the broker applies it a moment later. Until a
    # record over it is refused, the test's own records could still go through.
    from confluent_kafka import Producer

    probe = Producer(settings.librdkafka())
    errors: list[str] = []

    def refused() -> bool:
        probe.produce(
            settings.topics.requests,
            key=b"limit-probe",
            value=b"x" * (max_bytes + 100),
            on_delivery=lambda err, _msg: errors.append(err.name() if err else ""),
        )
        probe.flush(scaled(30))
        return bool(errors) and errors[-1] == "MSG_SIZE_TOO_LARGE"

    wait_until(refused, 30, 0.2, f"the broker never applied max.message.bytes={max_bytes}")


def test_broker_rejection_reaches_the_caller(settings: Any) -> None:
    """The broker refuses records over the topic's max.message.bytes: every API form raises."""
    _limit_message_size(settings, 300)
    # Random: producers compress their batches, and a repeated character would fit.
    big = {"blob": secrets.token_hex(1000)}
    with JobClient(settings) as client:
        # A small command still goes through on the same topic...
        client.cancel("small")
        # ...a large one is refused by the broker and the error reaches the caller.
        with pytest.raises(DeliveryError) as info:
            client.schedule("big", task="demo.echo", args=big, now=True)
        assert info.value.code == "MSG_SIZE_TOO_LARGE"
        with pytest.raises(DeliveryError) as batch_info:
            client.schedule_many(
                [JobSpec(task="demo.echo", now=True), JobSpec(task="demo.echo", now=True, args=big)]
            )
        assert batch_info.value.code == "MSG_SIZE_TOO_LARGE"
        # The broker refuses a whole record batch, so the small one may fail alongside.
        assert "of 2 commands not delivered" in str(batch_info.value)

    async def main() -> None:
        async with AsyncJobClient(settings) as client:
            with pytest.raises(DeliveryError) as async_info:
                await client.schedule("big", task="demo.echo", args=big, now=True)
            assert async_info.value.code == "MSG_SIZE_TOO_LARGE"

    asyncio.run(main())


def test_missing_topic_reaches_the_caller(settings: Any) -> None:
    """Topics are not auto-created: a wrong prefix fails delivery instead of hanging."""
    wrong = settings.model_copy(update={"topic_prefix": settings.topic_prefix + "-missing"})
    overrides = {"message.timeout.ms": 3000}
    with JobClient(wrong, producer_overrides=overrides) as client:
        with pytest.raises(DeliveryError) as info:
            client.schedule(task="demo.echo", now=True)
    assert info.value.code in {"_MSG_TIMED_OUT", "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC"}

    async def main() -> None:
        async with AsyncJobClient(wrong, producer_overrides=overrides) as client:
            with pytest.raises(DeliveryError):
                await client.cancel("job-1")

    asyncio.run(main())
