"""Kafka ACLs on a real SASL/SCRAM broker with the standard authorizer.

The test starts its own secure broker (``jobwheel broker start --secure`` as a subprocess, on
free ports, in a temporary data dir), creates the topics as the admin, runs ``jobwheel acls
apply`` and then uses each role's credentials exactly as a jobwheel process gets them: the
JSON that ``acls apply`` wrote, passed as ``JOBWHEEL_KAFKA_CONFIG``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobwheel.deploy.broker import LocalBroker, free_port
from jobwheel.kafka.admin import describe_group
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State
from jobwheel.settings import Settings
from tests.support import BROKER_JVM_OPTIONS, Procs, jobwheel_argv, scaled, wait_until

pytestmark = pytest.mark.integration


def _jobwheel(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobwheel_argv(["jobwheel", *args]),
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(180),
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A secure broker, its topics, and every role's credentials from `jobwheel acls apply`."""
    root = tmp_path_factory.mktemp("secure")
    data_dir = root / "kafka"
    port, controller = free_port(), free_port()
    prefix = f"acl{uuid.uuid4().hex[:8]}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    base |= {
        "JOBWHEEL_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "JOBWHEEL_TOPIC_PREFIX": prefix,
        "JOBWHEEL_PARTITIONS": "2",
        "JOBWHEEL_DATA_DIR": str(root / "data"),
        "JOBWHEEL_SCHEDULER_APP_ID": f"{prefix}-scheduler",
        "JOBWHEEL_WORKER_GROUP": f"{prefix}-workers",
        "JOBWHEEL_STATUS_GROUP": f"{prefix}-status",
        "JOBWHEEL_BROKER_HEAP": "384m",
        "JOBWHEEL_BROKER_JVM_OPTIONS": BROKER_JVM_OPTIONS,
        "JOBWHEEL_LOG_FORMAT": "text",
    }
    started = _jobwheel(
        base,
        "broker",
        "start",
        "--secure",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--controller-port",
        str(controller),
    )
    broker = LocalBroker(data_dir, port=port, controller_port=controller)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert broker.secure and oct(broker.admin_config_path.stat().st_mode & 0o777) == "0o600"
        status = _jobwheel(base, "broker", "status", "--data-dir", str(data_dir))
        assert status.returncode == 0 and "ready" in status.stdout, status.stdout
        admin_env = base | {"JOBWHEEL_KAFKA_CONFIG": broker.admin_config_path.read_text()}
        topics = _jobwheel(admin_env, "topics", "ensure")
        assert topics.returncode == 0, topics.stderr
        creds = root / "creds"
        applied = _jobwheel(admin_env, "acls", "apply", "--out", str(creds))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        roles = {p.stem: json.loads(p.read_text()) for p in creds.glob("*.json")}
        assert set(roles) == {"submitter", "scheduler", "worker", "sink", "api"}
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in creds.glob("*.json"))
        yield {
            "base": base,
            "admin_env": admin_env,
            "roles": roles,
            "creds": creds,
            "prefix": prefix,
            "bootstrap": f"127.0.0.1:{port}",
            "broker": broker,
        }
    finally:
        # A client a failed call's traceback still holds (a reference cycle through the test's
        # frame) lives until the garbage collector runs; destroyed after the broker stops, it
        # logs "Connection refused" into the run's output first. Destroy them while it is up.
        gc.collect()
        broker.stop()


def _settings(secure: dict[str, Any], kafka_config: dict[str, Any] | None) -> Settings:
    base = secure["base"]
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=secure["bootstrap"],
        topic_prefix=secure["prefix"],
        partitions=2,
        scheduler_app_id=base["JOBWHEEL_SCHEDULER_APP_ID"],
        worker_group=base["JOBWHEEL_WORKER_GROUP"],
        status_group=base["JOBWHEEL_STATUS_GROUP"],
        kafka_config=kafka_config or {},
    )


def _produce(
    settings: Settings,
    topic: str,
    value: bytes = b"forged",
    *,
    key: bytes = b"job-1",
    headers: list[tuple[str, bytes]] | None = None,
    **overrides: Any,
) -> str | None:
    """Produce one record as jobwheel's producers do; None when the broker acknowledged it,
    else the error's name."""
    from confluent_kafka import KafkaException, Producer

    from jobwheel.kafka.producer import producer_config

    errors: list[str] = []
    producer = Producer(producer_config(settings, **{"message.timeout.ms": 15_000, **overrides}))
    producer.produce(
        topic,
        key=key,
        value=value,
        headers=headers or [],
        on_delivery=lambda err, msg: errors.append(err.name() if err else ""),
    )
    try:
        producer.flush(60)
    except (KafkaException, SystemError) as exc:  # fatal: no write right, no producer id
        # Seen with this test alone on a fresh broker: the fatal error was raised inside
        # flush() while it still called the delivery callback, whose first call into the
        # client then failed with SystemError; the fatal KafkaException is its cause.
        fatal = exc if isinstance(exc, KafkaException) else exc.__cause__
        assert isinstance(fatal, KafkaException), exc
        return str(fatal.args[0].name())
    assert len(errors) == 1, "no delivery report"
    return errors[0] or None


def _role(secure: dict[str, Any], role: str) -> Settings:
    return _settings(secure, secure["roles"][role])


def test_a_submitter_writes_requests_only(secure: dict[str, Any]) -> None:
    submitter = _role(secure, "submitter")
    t = submitter.topics
    assert _produce(submitter, t.requests) is None
    for topic in (t.runs, t.acks, t.status, t.dead_letter, t.workers):
        assert _produce(submitter, topic) == "TOPIC_AUTHORIZATION_FAILED", topic


def test_a_worker_writes_acks_and_its_announcement_only(secure: dict[str, Any]) -> None:
    worker = _role(secure, "worker")
    t = worker.topics
    assert _produce(worker, t.acks) is None
    assert _produce(worker, t.workers) is None
    for topic in (t.requests, t.runs, t.status):
        assert _produce(worker, topic) == "TOPIC_AUTHORIZATION_FAILED", topic


def test_the_scheduler_and_the_sink_get_their_part_only(secure: dict[str, Any]) -> None:
    scheduler, sink = _role(secure, "scheduler"), _role(secure, "sink")
    t = scheduler.topics
    for topic in (t.runs, t.status, t.dead_letter):
        assert _produce(scheduler, topic) is None, topic
    for topic in (t.requests, t.acks):
        assert _produce(scheduler, topic) == "TOPIC_AUTHORIZATION_FAILED", topic
    for topic in (t.status, t.acks, t.requests, t.runs):
        # no write right on any topic: not even an idempotent producer id
        refused = _produce(sink, topic)
        assert refused in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"), topic


def test_transactional_ids_are_the_schedulers_own(secure: dict[str, Any]) -> None:
    from confluent_kafka import KafkaException, Producer

    scheduler = _role(secure, "scheduler")
    app = scheduler.scheduler_app_id
    own = Producer(scheduler.librdkafka(**{"transactional.id": f"{app}-dispatch-0"}))
    own.init_transactions(30)
    own.begin_transaction()
    own.produce(scheduler.topics.runs, key=b"job-1", value=b"run")
    own.commit_transaction(30)
    for settings, txn in ((scheduler, "someone-else-0"), (_role(secure, "worker"), f"{app}-x")):
        other = Producer(settings.librdkafka(**{"transactional.id": txn}))
        with pytest.raises(KafkaException) as info:
            other.init_transactions(30)
        assert info.value.args[0].name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


def test_reads_need_the_topic_and_the_group(secure: dict[str, Any]) -> None:
    from tests.support import consume

    worker, submitter = _role(secure, "worker"), _role(secure, "submitter")
    admin = _settings(secure, secure["broker"].admin_config())
    assert _produce(admin, admin.topics.runs, b"for the worker") is None
    got = consume(worker, worker.topics.runs, min_count=3, group=worker.worker_group)
    assert b"for the worker" in [m.value() for m in got]
    with pytest.raises(AssertionError, match="TOPIC_AUTHORIZATION_FAILED|GROUP_AUTHORIZATION"):
        _consume_or_raise(submitter, submitter.topics.runs, submitter.worker_group)
    with pytest.raises(AssertionError, match="GROUP_AUTHORIZATION_FAILED"):
        _consume_or_raise(worker, worker.topics.runs, "some-other-group")


def _consume_or_raise(settings: Settings, topic: str, group: str) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        settings.librdkafka(
            **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
    )
    try:
        consumer.subscribe([topic])
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None:
                raise AssertionError(msg.error().name())
            if msg is not None:
                return
        raise RuntimeError("neither a record nor an error")
    finally:
        consumer.close()


def test_without_credentials_or_with_a_wrong_password_nothing_is_written(
    secure: dict[str, Any],
) -> None:
    nobody = _settings(secure, None)
    wrong = _settings(secure, {**secure["roles"]["submitter"], "sasl.password": "guess"})
    for settings in (nobody, wrong):
        assert _produce(settings, settings.topics.requests, **{"message.timeout.ms": 5000})


def test_jobwheel_processes_take_their_role_from_kafka_config(
    secure: dict[str, Any], tmp_path: Path
) -> None:
    """The SDK and the CLI with JOBWHEEL_KAFKA_CONFIG = a role's file, unchanged."""
    from jobwheel.producers import JobClient

    with JobClient(_role(secure, "submitter"), delivery_timeout_s=30) as client:
        assert client.schedule(task="demo.echo", now=True)
    env = secure["base"] | {"JOBWHEEL_KAFKA_CONFIG": (secure["creds"] / "api.json").read_text()}
    submitted = _jobwheel(env, "submit", "--task", "demo.echo", "--in", "5s")
    assert submitted.returncode == 0, submitted.stderr
    # It read the workers roster (the api role may): no worker is live here, and it says so,
    # rather than that it cannot tell.
    assert "no live worker announces itself" in submitted.stderr, submitted.stderr
    as_worker = secure["base"] | {
        "JOBWHEEL_KAFKA_CONFIG": (secure["creds"] / "worker.json").read_text()
    }
    refused = _jobwheel(as_worker, "submit", "--task", "demo.echo", "--in", "5s")
    assert refused.returncode == 1 and "TOPIC_AUTHORIZATION_FAILED" in refused.stderr


def test_the_api_role_reads_dead_letters_describes_the_groups_and_waits_for_results(
    secure: dict[str, Any],
) -> None:
    """What `jobwheel serve` does beyond its embedded sink, with the api role's rights only:
    list dead letters (the console, `dlq list`), describe the scheduler and worker groups (the
    console's cluster page), and `client.wait` (reads the status and acks topics at the job's
    partition). Each record is written by the role that writes it in a deployment. The grants
    are what make it work: the sink role cannot read the dead letters, and the api role cannot
    describe a group it was not given."""
    from confluent_kafka import Consumer

    from jobwheel.errors import BrokerError
    from jobwheel.producers.client import JobClient
    from jobwheel.producers.deadletters import Filter, read_dead_letters
    from jobwheel.schemas.models import StatusEvent
    from jobwheel.schemas.topics import DEAD_RUN_KIND, ERROR_HEADER, KIND_HEADER
    from tests.integration.scheduler_support import make_run
    from tests.status_support import now_ms

    api, scheduler, worker = (_role(secure, r) for r in ("api", "scheduler", "worker"))
    codec = default_codec()
    job = f"acl-api-{uuid.uuid4().hex[:6]}"
    run = make_run(scheduler, "demo.fail", job_id=job, run_id=f"{job}@1")
    dead = [(KIND_HEADER, DEAD_RUN_KIND), (ERROR_HEADER, b"RuntimeError: always")]
    assert (
        _produce(
            scheduler,
            scheduler.topics.dead_letter,
            codec.encode(run),
            key=job.encode(),
            headers=dead,
        )
        is None
    )
    letters = read_dead_letters(api, Filter(job_id=job), timeout_s=scaled(30))
    assert [(d.kind, d.run.run_id if d.run else None) for d in letters] == [
        ("dead-run", run.run_id)
    ]
    # Without DESCRIBE on it the broker leaves the topic out of the sink's metadata.
    with pytest.raises(BrokerError, match="dead-letter topic .* not found"):
        read_dead_letters(_role(secure, "sink"), Filter(job_id=job), timeout_s=scaled(30))

    # A member in the worker group (as the worker role), so there is something to describe.
    member = Consumer(worker.librdkafka(**{"group.id": worker.worker_group, "client.id": job}))
    try:
        member.subscribe([worker.topics.runs])
        wait_until(
            lambda: member.poll(0.2) is None and member.assignment(),
            scaled(60),
            0.1,
            "the worker-role consumer got no partitions",
        )
        _, members = describe_group(api, api.worker_group, scaled(15))
        assert [(m.client_id, len(m.assigned)) for m in members] == [(job, 2)]
    finally:
        member.close()
    state, _ = describe_group(api, api.scheduler_app_id, scaled(15))
    assert state  # described, member or none
    with pytest.raises(BrokerError, match="GROUP_AUTHORIZATION_FAILED"):
        describe_group(api, "some-other-group", scaled(15))

    # The job's outcome as a worker (acks) and the scheduler (status) write it.
    waited = f"{job}-w"
    at = now_ms()

    def event(state: State, **fields: Any) -> bytes:
        return codec.encode(
            StatusEvent(f"{waited}:{state.value}", waited, state, at, "test", seq=3, **fields)
        )

    ok = event(State.SUCCEEDED, run_id=f"{waited}@1", attempt=1, result_json='{"x": 1}')
    assert _produce(worker, worker.topics.acks, ok, key=waited.encode()) is None
    done = event(State.COMPLETED)
    assert _produce(scheduler, scheduler.topics.status, done, key=waited.encode()) is None
    with JobClient(api) as client:
        since = datetime.now(UTC) - timedelta(minutes=1)
        assert client.wait(waited, timeout=scaled(30), since=since) == {"x": 1}


def test_apply_again_keeps_passwords_and_revokes_extra_grants(secure: dict[str, Any]) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(_settings(secure, secure["broker"].admin_config()).librdkafka())
    worker_principal = f"User:{secure['roles']['worker']['sasl.username']}"
    extra = AclBinding(
        ResourceType.TOPIC,
        f"{secure['prefix']}.requests",
        ResourcePatternType.LITERAL,
        worker_principal,
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    for future in admin.create_acls([extra]).values():
        future.result(timeout=30)
    worker = _role(secure, "worker")
    assert _produce(worker, worker.topics.requests) is None  # the hand-made grant works...
    again = _jobwheel(secure["admin_env"], "acls", "apply", "--out", str(secure["creds"]))
    assert again.returncode == 0, again.stderr
    assert "1 revoked" in again.stdout
    roles = {p.stem: json.loads(p.read_text()) for p in secure["creds"].glob("*.json")}
    assert roles == secure["roles"]  # same passwords: running processes keep working
    assert _produce(worker, worker.topics.requests) == "TOPIC_AUTHORIZATION_FAILED"  # ...no more


def test_worker_and_serve_processes_run_with_their_roles(
    secure: dict[str, Any], procs: Procs, tmp_path: Path
) -> None:
    """A real `jobwheel worker` whose only Kafka rights are the worker role's reads a run
    (written here as the scheduler) and reports on acks, which the sink's principal reads; a
    real `jobwheel serve` as the api role runs its embedded sink on them."""
    from tests.integration.scheduler_support import make_run
    from tests.support import DEMO_TASKS, consume, log_tail, start_worker

    scheduler, sink = _role(secure, "scheduler"), _role(secure, "sink")
    run = make_run(scheduler, "demo.echo", {"x": 1}, job_id=f"acl-{uuid.uuid4().hex[:6]}")
    assert _produce(scheduler, scheduler.topics.runs, default_codec().encode(run)) is None
    env = secure["base"] | {
        "JOBWHEEL_KAFKA_CONFIG": (secure["creds"] / "worker.json").read_text(),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "worker.log"
    start_worker(procs, env, log, tasks=DEMO_TASKS)

    def succeeded() -> bool:
        acks = consume(sink, sink.topics.acks, min_count=100, timeout_s=2)
        # the earlier tests left forged bytes on acks: only this worker's events decode
        states = [default_codec().decode(m.value()) for m in acks if m.value()[:2] == b"\xc3\x01"]
        return any(e.run_id == run.run_id and e.state == State.SUCCEEDED for e in states)

    wait_until(succeeded, 90, interval_s=0.5, message="no SUCCEEDED on acks:\n" + log_tail(log))

    # `jobwheel serve` (API + embedded sink) as the api role: its sink reads those acks
    port = free_port()
    serve_env = secure["base"] | {
        "JOBWHEEL_KAFKA_CONFIG": (secure["creds"] / "api.json").read_text(),
        "JOBWHEEL_API_PORT": str(port),
        "JOBWHEEL_DATA_DIR": str(tmp_path / "serve"),
        "PYTHONUNBUFFERED": "1",
    }
    serve_log = tmp_path / "serve.log"
    procs.spawn(["jobwheel", "serve"], serve_env, serve_log)

    def sink_inserted() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                return int(json.loads(resp.read())["sink"]["inserted"])
        except OSError:
            return 0

    wait_until(lambda: sink_inserted() >= 2, 90, interval_s=0.5, message=log_tail(serve_log))


def test_a_scheduler_process_runs_with_its_role_only(
    secure: dict[str, Any], procs: Procs, tmp_path: Path
) -> None:
    """A real `jobwheel scheduler` whose only rights are the scheduler role's: it joins its
    group, sets its group's timing, restores and writes its changelog, and commits runs in
    transactions; a job sent by a submitter fires."""
    from jobwheel.producers.client import JobClient
    from tests.integration.scheduler_support import log_events
    from tests.support import consume, log_tail

    env = secure["base"] | {
        "JOBWHEEL_KAFKA_CONFIG": (secure["creds"] / "scheduler.json").read_text(),
        "JOBWHEEL_DATA_DIR": str(tmp_path / "scheduler"),
        "JOBWHEEL_LOG_FORMAT": "json",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "scheduler.log"
    procs.spawn(["jobwheel", "scheduler"], env, log)
    wait_until(lambda: len(log_events(log, "partition ready")) >= 2, 90, 0.5, log_tail(log))
    job_id = f"acl-sched-{uuid.uuid4().hex[:6]}"
    with JobClient(_role(secure, "submitter")) as client:
        client.schedule(job_id, task="demo.echo", now=True)
    worker = _role(secure, "worker")

    def fired() -> bool:
        runs = consume(worker, worker.topics.runs, min_count=1000, timeout_s=2)
        return any(
            default_codec().decode(m.value()).job_id == job_id
            for m in runs
            if m.value() and m.value()[:2] == b"\xc3\x01"
        )

    wait_until(fired, 60, interval_s=0.5, message="the job never fired:\n" + log_tail(log))
    text = log.read_text()
    assert "AUTHORIZATION_FAILED" not in text, log_tail(log)
    assert not log_events(
        log, "the broker refused the scheduler group's timing; using the broker's defaults"
    )


def test_a_worker_without_dead_letter_rights_still_answers_an_undecodable_run(
    secure: dict[str, Any], procs: Procs, tmp_path: Path
) -> None:
    """The worker role may not write the dead-letter topic. Its copy of a run record it cannot
    decode is refused for good; the worker says so in an error line and gives the copy up, so
    the run is still answered FAILED (from the record's ``jobwheel.run`` header) and the
    partition goes on: the run after it runs. Retrying the copy would have held the commit of
    the partition, and every run after it, for ever. (Last in the module: the record it leaves
    on the runs topic is framed like a run and reads as none.)"""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    from jobwheel.kafka.producer import producer_config
    from jobwheel.schemas.topics import RUN_HEADER, run_header
    from tests.integration.scheduler_support import make_run
    from tests.support import DEMO_TASKS, consume, log_tail, start_worker

    scheduler, sink = _role(secure, "scheduler"), _role(secure, "sink")
    job = f"acl-undecodable-{uuid.uuid4().hex[:6]}"
    run = make_run(scheduler, "demo.echo", job_id=job, run_id=f"{job}@1")
    after = make_run(scheduler, "demo.echo", {"after": 1}, job_id=job, run_id=f"{job}@2")
    encoded = default_codec().encode(run)
    newer = encoded[:2] + bytes.fromhex("0123456789abcdef") + encoded[10:]  # unknown schema
    producer = Producer(producer_config(scheduler))
    producer.produce(
        scheduler.topics.runs,
        key=job.encode(),
        value=newer,
        headers=[(RUN_HEADER, run_header(run))],
    )
    delivered: list[Any] = []
    producer.produce(
        scheduler.topics.runs,
        key=job.encode(),
        value=default_codec().encode(after),
        on_delivery=lambda err, msg: delivered.append(err or msg),
    )
    assert producer.flush(60) == 0
    (last,) = delivered
    assert not isinstance(last, KafkaError), last
    env = secure["base"] | {
        "JOBWHEEL_KAFKA_CONFIG": (secure["creds"] / "worker.json").read_text(),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "worker.log"
    start_worker(procs, env, log, tasks=DEMO_TASKS)

    def answered() -> dict[str, Any]:
        acks = consume(sink, sink.topics.acks, min_count=1000, timeout_s=2)
        events = [default_codec().decode(m.value()) for m in acks if m.value()[:2] == b"\xc3\x01"]
        return {
            e.run_id: e
            for e in events
            if e.run_id in (run.run_id, after.run_id) and e.state in (State.FAILED, State.SUCCEEDED)
        }

    seen = wait_until(lambda: len(got := answered()) == 2 and got, 90, 0.5, "no verdicts on acks")
    assert seen[run.run_id].state is State.FAILED, log_tail(log)
    assert (seen[run.run_id].error or "").startswith("UndecodableRun: ")
    assert seen[after.run_id].state is State.SUCCEEDED
    # the partition is committed past both: the refused copy does not hold it
    admin = Consumer(
        _settings(secure, secure["broker"].admin_config()).librdkafka(
            **{"group.id": scheduler.worker_group}
        )
    )
    try:

        def committed() -> int:
            tp = TopicPartition(scheduler.topics.runs, last.partition())
            return admin.committed([tp], timeout=10)[0].offset

        wait_until(lambda: committed() > last.offset(), 30, 0.5, "not committed past the runs")
    finally:
        admin.close()
    text = log.read_text()
    assert "undecodable run record not dead-lettered" in text, log_tail(log)
    assert "TOPIC_AUTHORIZATION_FAILED" in text
