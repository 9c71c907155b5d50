"""TLS, SASL and ACLs on a three-node cluster: `jobwheel up --secure --nodes 3`, used as a user
would, with clients that have only the secure config a role's file gives them.

The module starts one secure stack (three KRaft nodes, each with SASL_SSL on its client,
inter-broker and controller listeners, the topics at replication factor 3, one principal per
role) and its tests share it, as the cluster tests share ``kafka_cluster``: starting the JVMs
is the slow part.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from jobwheel.deploy.broker import LocalCluster, free_port
from jobwheel.settings import Settings
from tests.support import (
    BROKER_JVM_OPTIONS,
    jobwheel_argv,
    log_tail,
    scaled,
    spawn,
    stop,
    wait_until,
)

pytestmark = pytest.mark.integration

ROLES = ("scheduler", "worker", "api", "submitter")


@pytest.fixture(scope="module")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`jobwheel up --secure --nodes 3` on free ports, up until the module's tests are done."""
    root = tmp_path_factory.mktemp("secure-cluster")
    data = root / "data"
    prefix = f"tls{uuid.uuid4().hex[:8]}"
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env |= {
        "JOBWHEEL_DATA_DIR": str(data),
        "JOBWHEEL_BROKER_PORT": str(free_port()),
        "JOBWHEEL_BROKER_CONTROLLER_PORT": str(free_port()),
        "JOBWHEEL_TOPIC_PREFIX": prefix,
        "JOBWHEEL_PARTITIONS": "3",
        "JOBWHEEL_SCHEDULER_APP_ID": f"{prefix}-scheduler",
        "JOBWHEEL_WORKER_GROUP": f"{prefix}-workers",
        "JOBWHEEL_STATUS_GROUP": f"{prefix}-status",
        "JOBWHEEL_API_PORT": str(api_port),
        "JOBWHEEL_METRICS_PORT": str(free_port()),
        "JOBWHEEL_LOG_FORMAT": "text",
        "JOBWHEEL_BROKER_JVM_OPTIONS": BROKER_JVM_OPTIONS,
    }
    log = root / "up.log"
    proc = spawn(["jobwheel", "up", "--secure", "--nodes", "3"], env, log)
    try:
        wait_until(
            lambda: "jobwheel stack up" in log.read_text() or proc.poll() is not None,
            300,
            interval_s=0.5,
            message=f"the secure stack never came up:\n{log_tail(log)}",
        )
        assert proc.poll() is None, log_tail(log)
        creds = data / "kafka-credentials"
        yield {
            "env": env,
            "log": log,
            "cluster": LocalCluster.load(data / "kafka"),
            "roles": {role: json.loads((creds / f"{role}.json").read_text()) for role in ROLES},
            "creds": creds,
            "data": data,
            "api": f"http://127.0.0.1:{api_port}",
        }
    finally:
        code = stop(proc, timeout_s=120)
        print(f"--- jobwheel up (exit {code}); {log}\n{log_tail(log)}")
        if (data / "kafka" / "cluster.json").is_file():  # a stack killed leaves its nodes
            LocalCluster.load(data / "kafka").stop(timeout_s=10)


def _logs(stack: dict[str, Any]) -> str:
    """The stack's terminal and each service's log, for a failure's message."""
    parts = [f"--- jobwheel up\n{log_tail(stack['log'], 30)}"]
    for path in sorted((stack["data"] / "logs").glob("*.log")):
        parts.append(f"--- {path.name}\n{log_tail(path, 30)}")
    return "\n".join(parts)


def _quiet() -> logging.Logger:
    logger = logging.getLogger("tests.tls.librdkafka")
    logger.setLevel(logging.CRITICAL)
    return logger


def _metadata(config: dict[str, Any]) -> set[int] | str:
    """The brokers a metadata request with ``config`` lists, or the error that refused it."""
    try:
        md = AdminClient({**config, "logger": _quiet()}).list_topics(timeout=scaled(5))
    except KafkaException as exc:
        return str(exc.args[0].name())
    return set(md.brokers)


def _finished(api: str, job_id: str) -> list[str] | None:
    """The states of a job's runs once the job is COMPLETED (a one-off job whose run ended),
    from the status API; None before (or while the API does not answer)."""
    try:
        with urllib.request.urlopen(f"{api}/jobs/{job_id}", timeout=scaled(10)) as resp:
            detail = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if detail["job"]["state"] != "COMPLETED":
        return None
    return [run["state"] for run in detail["runs"]]


def test_every_listener_of_every_node_is_sasl_over_tls(secure_stack: dict[str, Any]) -> None:
    cluster: LocalCluster = secure_stack["cluster"]
    assert cluster.secure and len(cluster.nodes) == 3
    for node_id in cluster.node_ids:
        props = dict(
            line.split("=", 1)
            for line in cluster.node(node_id).properties_path.read_text().splitlines()
            if line and not line.startswith("#")
        )
        assert props["listener.security.protocol.map"] == "CONTROLLER:SASL_SSL,SASL_SSL:SASL_SSL"
        assert props["inter.broker.listener.name"] == "SASL_SSL"
        assert all(
            listener.split("://")[0] in ("SASL_SSL", "CONTROLLER")
            for listener in props["listeners"].split(",")
        ), props["listeners"]
        assert props["ssl.truststore.location"] == str(cluster.ca_cert_path)

    # `broker status` reaches every node as the admin (its ready probe speaks SASL_SSL too)
    def status() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            jobwheel_argv(["jobwheel", "broker", "status", "--data-dir", str(cluster.data_dir)]),
            env=secure_stack["env"],
            capture_output=True,
            text=True,
            timeout=scaled(120),
            check=False,
        )

    # Asked again while a node says "not answering": on a loaded host one probe can miss its
    # wait (a full suite saw all three miss it once); a node that never answers fails here.
    seen: list[subprocess.CompletedProcess[str]] = []

    def all_ready() -> bool:
        seen.append(status())
        return seen[-1].returncode == 0 and seen[-1].stdout.count(", ready, ") == 3

    try:
        wait_until(all_ready, 120, 1.0)
    except AssertionError:
        raise AssertionError(
            f"broker status never showed three ready nodes:\n{seen[-1].stdout}{seen[-1].stderr}"
        ) from None
    for role, config in secure_stack["roles"].items():
        assert config["security.protocol"] == "SASL_SSL", role
        assert config["ssl.ca.location"] == str(cluster.ca_cert_path), role
        assert config["bootstrap.servers"] == cluster.bootstrap, role


def test_jobs_run_end_to_end_with_role_configs_only(secure_stack: dict[str, Any]) -> None:
    """The stack's scheduler, worker and API (its sink) run as their roles over SASL_SSL; the
    SDK and `jobwheel submit` have the submitter's file and nothing else, and every job they
    send runs once, SUCCEEDED, as the API (its sink) shows."""
    from jobwheel.producers import JobClient

    submitter = secure_stack["roles"]["submitter"]
    env = secure_stack["env"]
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=submitter["bootstrap.servers"],
        topic_prefix=env["JOBWHEEL_TOPIC_PREFIX"],
        partitions=3,
        kafka_config=submitter,
    )
    try:
        with JobClient(settings, delivery_timeout_s=scaled(60)) as client:
            job_ids = [client.schedule(task="demo.echo", now=True, args={"i": i}) for i in range(4)]
    except Exception as exc:
        raise AssertionError(f"the SDK could not schedule: {exc}\n{_logs(secure_stack)}") from exc
    cli_env = {k: v for k, v in env.items() if k != "JOBWHEEL_BROKER_PORT"}
    cli_env["JOBWHEEL_BOOTSTRAP_SERVERS"] = submitter["bootstrap.servers"]
    cli_env["JOBWHEEL_KAFKA_CONFIG"] = (secure_stack["creds"] / "submitter.json").read_text()
    submitted = subprocess.run(
        jobwheel_argv(["jobwheel", "submit", "--task", "demo.echo", "--in", "1s"]),
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_ids.append(submitted.stdout.strip())

    api = secure_stack["api"]
    for job_id in job_ids:
        try:
            runs = wait_until(
                lambda job_id=job_id: _finished(api, job_id),
                180,
                interval_s=0.5,
                message=f"{job_id} never COMPLETED",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(secure_stack)}") from None
        assert runs == ["SUCCEEDED"], (job_id, runs)

    # the topics the jobs went through are replicated on all three nodes
    admin = secure_stack["cluster"].admin_config()
    md = AdminClient(
        {"bootstrap.servers": secure_stack["cluster"].bootstrap, **admin, "logger": _quiet()}
    ).list_topics(settings.topics.requests, timeout=scaled(10))
    replicas = {len(p.replicas) for p in md.topics[settings.topics.requests].partitions.values()}
    assert replicas == {3}


def test_a_plaintext_client_or_one_without_the_ca_is_refused(
    secure_stack: dict[str, Any],
) -> None:
    cluster: LocalCluster = secure_stack["cluster"]
    submitter = secure_stack["roles"]["submitter"]
    # the same request with the role's file as it is: every node answers
    assert _metadata(submitter) == {1, 2, 3}
    bootstrap = {"bootstrap.servers": cluster.bootstrap}
    credentials = {k: v for k, v in submitter.items() if not k.startswith("ssl.")}
    refused = {
        "plaintext": _metadata(bootstrap),
        "SASL without TLS": _metadata(credentials | {"security.protocol": "SASL_PLAINTEXT"}),
        "TLS without the CA": _metadata(credentials),
    }
    assert all(isinstance(err, str) for err in refused.values()), refused
    print(f"refused: {refused}")
