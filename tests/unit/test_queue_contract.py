"""The queue in the contract: job_command.v4 and run.v2 carry it, and records written with the
schemas from before queues read as the ``default`` queue (schema evolution rules 1-2), for both
codec paths (the C fast path and the generated Python) and the job state's records."""

from __future__ import annotations

import io

import orjson
import pytest
from fastavro import schemaless_writer

from jobwheel.errors import ValidationError
from jobwheel.schemas.catalogue import SchemaCatalogue
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import (
    DEFAULT_QUEUE,
    JobCommand,
    Now,
    ReplayRun,
    Run,
    ScheduleJob,
)
from jobwheel.schemas.topics import Topics, runs_topic
from jobwheel.schemas.validation import check_command, queue
from jobwheel.settings import Settings
from jobwheel.streams.jobstate import JobRecord, decode_job, encode_job

# fixed dates: issue times given to the codec and the pure checks with their own "now", never
# compared with the wall clock (the CLI test sends no time of its own)
CATALOGUE = SchemaCatalogue.load()


def _old(label: str, record: dict[str, object]) -> bytes:
    version = next(v for v in CATALOGUE.versions if v.label() == label)
    body = io.BytesIO()
    schemaless_writer(body, version.parsed, record)
    return b"\xc3\x01" + version.fingerprint + body.getvalue()


@pytest.fixture(params=[True, False], ids=["c", "python"])
def codec(request: pytest.FixtureRequest) -> Codec:
    return Codec(native=request.param)


def test_a_schedule_written_with_job_command_v3_reads_as_the_default_queue(codec: Codec) -> None:
    data = _old(
        "job_command.v3",
        {
            "command_id": "c-old",
            "job_id": "job-old",
            "issued_at_ms": 1_600_000_000_000,
            "body": (
                "io.jobwheel.ScheduleJob",
                {"task": "demo.echo", "trigger": ("io.jobwheel.Now", {})},
            ),
        },
    )
    command = codec.decode(data)
    assert isinstance(command, JobCommand) and isinstance(command.body, ScheduleJob)
    assert command.body.queue == DEFAULT_QUEUE == "default"


def test_a_run_written_with_run_v1_reads_as_the_default_queue(codec: Codec) -> None:
    fields = {
        "run_id": "job-1@1",
        "job_id": "job-1",
        "task": "demo.echo",
        "args_json": "{}",
        "seq": 1,
        "scheduled_time_ms": 1,
        "dispatched_at_ms": 2,
        "attempt": 1,
        "max_attempts": 3,
        "timeout_ms": None,
        "visibility_timeout_ms": 30_000,
        "deadline_ms": 30_002,
        "partition": 0,
        "fencing_token": 1,
    }
    run = codec.decode(_old("run.v1", fields))
    assert isinstance(run, Run)
    assert run.queue == "default"
    assert run == Run(**fields)  # type: ignore[arg-type]


def test_the_queue_round_trips_in_commands_runs_and_job_records(codec: Codec) -> None:
    schedule = ScheduleJob("reports.build", Now(), queue="reports")
    replay = ReplayRun("job-1@5", 5, 3, "reports.build", queue="reports")
    for body in (schedule, replay):
        command = JobCommand("c-1", "job-1", 1_700_000_000_000, body)
        assert codec.decode(codec.encode(command)) == command
    run = Run("job-1@5", "job-1", "reports.build", "{}", 1, 5, 6, 1, 3, None, 30_000, 9, 0, 1)
    run = Run(**{**{f: getattr(run, f) for f in run.__slots__}, "queue": "reports"})
    assert codec.decode(codec.encode(run)).queue == "reports"
    job = JobRecord(job_id="job-1", spec=schedule, issued_at_ms=1)
    assert decode_job(encode_job(job)).spec.queue == "reports"


def test_a_job_record_from_before_queues_reads_as_the_default_queue() -> None:
    data = encode_job(
        JobRecord(job_id="job-1", spec=ScheduleJob("demo.echo", Now()), issued_at_ms=1)
    )
    head, _, body = data.partition(b"{")
    document = orjson.loads(b"{" + body)
    del document["spec"]["queue"]
    assert decode_job(head + orjson.dumps(document)).spec.queue == "default"


@pytest.mark.parametrize("name", ["default", "reports", "gpu.large", "a_b-c", "x" * 64])
def test_queue_names_that_are_topic_name_fragments_pass(name: str) -> None:
    assert queue(name) == name
    command = JobCommand("c-1", "job-1", 1_700_000_000_000, ScheduleJob("t", Now(), queue=name))
    check_command(command, now_ms=1_700_000_000_000, max_args_bytes=1024)


@pytest.mark.parametrize("name", ["", "a b", "rep/orts", "x" * 65, ".", "..", "ü", "a:b", 3])
def test_other_queue_names_are_refused_naming_the_field(name: object) -> None:
    with pytest.raises(ValidationError, match="queue") as info:
        queue(name)
    assert info.value.field == "queue"
    command = JobCommand("c-1", "job-1", 1, ScheduleJob("t", Now(), queue=name))  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="queue"):
        check_command(command, now_ms=1, max_args_bytes=1024)


def test_each_declared_queue_has_its_runs_topic_and_default_keeps_the_old_one() -> None:
    assert runs_topic("jw", "default") == "jw.runs"
    assert runs_topic("jw", "reports") == "jw.runs.reports"
    settings = Settings(topic_prefix="jw", queues="reports, gpu", partitions=4)
    assert settings.queue_names == ("default", "reports", "gpu")
    specs = {s.name: s for s in settings.topics.specs()}
    for name in ("jw.runs", "jw.runs.reports", "jw.runs.gpu"):
        assert specs[name].partitions == 4  # co-partitioned with requests
    assert settings.worker_group_for("default") == settings.worker_group
    assert settings.worker_group_for("reports") == f"{settings.worker_group}-reports"
    assert len(Topics("jw").specs()) == len(settings.topics.specs()) - 2


def test_a_bad_queue_in_the_settings_is_refused() -> None:
    with pytest.raises(ValueError, match="queue"):
        Settings(queues="reports,bad name")


def test_every_declared_queue_has_its_grants() -> None:
    """On a cluster with an authorizer, a pool's workers read its topic in its group, and the
    scheduler writes every queue's topic; the default queue keeps the grants it had."""
    from jobwheel.deploy.acls import role_grants

    settings = Settings(topic_prefix="jw", queues="reports", worker_group="jw-workers")

    def names(role: str) -> set[tuple[str, str]]:
        return {(g.resource, g.name) for g in role_grants(settings, role)}

    assert {("TOPIC", "jw.runs"), ("TOPIC", "jw.runs.reports")} <= names("scheduler")
    worker = names("worker")
    assert {("TOPIC", "jw.runs"), ("TOPIC", "jw.runs.reports")} <= worker
    assert {("GROUP", "jw-workers"), ("GROUP", "jw-workers-reports")} <= worker


def test_a_worker_serves_the_queues_asked_else_its_tasks_queues_and_only_known_ones() -> None:
    from jobwheel.consumers.worker.cli import serving_queues
    from jobwheel.errors import ConfigError

    known = ("default", "reports")
    assert serving_queues(None, [], known) == ["default"]
    assert serving_queues(None, ["reports"], known) == ["reports"]
    assert serving_queues(["default"], ["reports"], known) == ["default"]
    # several: one pool each, in the order asked, each once
    assert serving_queues(["reports", "default", "reports"], [], known) == ["reports", "default"]
    assert serving_queues(None, ["default", "reports"], known) == ["default", "reports"]
    with pytest.raises(ConfigError, match="no queue 'gpu'.*jobwheel queues add gpu"):
        serving_queues(["default", "gpu"], [], known)
    with pytest.raises(ConfigError, match="queue"):
        serving_queues(["bad name"], [], known)


@pytest.mark.parametrize(
    ("args", "env", "wanted"),
    [
        (["--queue", "bad name"], {}, "is not a queue name"),
        (["--queue", "x" * 65], {"JOBWHEEL_QUEUES": "reports"}, "is not a queue name"),
    ],
)
def test_submit_refuses_a_bad_queue_name_before_sending(
    args: list[str], env: dict[str, str], wanted: str
) -> None:
    """Exit 2, one line naming the queue, nothing sent: no broker is needed to be refused
    (the command is built and checked before a producer exists). A well-formed queue that
    may have been added at run time is asked of the broker: see test_pools_runtime.py."""
    import os
    import subprocess

    from tests.support import jobwheel_argv, scaled

    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    result = subprocess.run(
        jobwheel_argv(["jobwheel", "submit", "--task", "demo.echo", "--now", *args]),
        env={**base, "JOBWHEEL_BOOTSTRAP_SERVERS": "127.0.0.1:1", **env},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert "queue" in line and wanted in line, line
