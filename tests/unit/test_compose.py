"""deploy/compose/docker-compose.yml is valid Compose and runs real jobwheel commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from jobwheel.cli import build_parser

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "docker-compose.yml"
JOBWHEEL_SERVICES = {"topics", "acls", "scheduler", "worker", "sink", "api"}
#: The secrets the stack refuses to start without (the file's header says how to make them).
SECRETS = {
    "JOBWHEEL_API_TOKEN": "api-token-1",
    "JOBWHEEL_KAFKA_ADMIN_PASSWORD": "admin-pw-1",
    "JOBWHEEL_KAFKA_SCHEDULER_PASSWORD": "scheduler-pw-1",
    "JOBWHEEL_KAFKA_WORKER_PASSWORD": "worker-pw-1",
    "JOBWHEEL_KAFKA_SINK_PASSWORD": "sink-pw-1",
    "JOBWHEEL_KAFKA_SUBMITTER_PASSWORD": "submitter-pw-1",
    "JOBWHEEL_CLICKHOUSE_SQL_PASSWORD": "sql-pw-1",
}


def _validator() -> list[str]:
    """`docker compose` (plugin) or Debian's `docker-compose`; both validate without an engine."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip(
        "no Compose validator: neither `docker compose` nor `docker-compose` is installed "
        "(`make setup` installs Debian's docker-compose when run as root)"
    )


def _compose(*args: str, secrets: dict[str, str] = SECRETS) -> subprocess.CompletedProcess[str]:
    # an empty --env-file: a developer's deploy/compose/.env must not change the outcome
    with tempfile.NamedTemporaryFile("w", suffix=".env") as empty:
        cmd = [*_validator(), "-f", str(COMPOSE_FILE), "--env-file", empty.name, *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")} | secrets
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)


def _services() -> dict[str, str]:
    """Each service's block of the resolved config, whitespace collapsed (for text checks)."""
    result = _compose("config")
    assert result.returncode == 0, result.stderr
    blocks: dict[str, list[str]] = {}
    current = None
    in_services = False
    for line in result.stdout.splitlines():
        if re.fullmatch(r"\S.*:", line):
            in_services = line == "services:"
            current = None
            continue
        if in_services and (match := re.fullmatch(r"  ([a-z]+):", line)):
            current = match.group(1)
            blocks[current] = []
        elif current:
            blocks[current].append(line.strip())
    return {name: " ".join(lines) for name, lines in blocks.items()}


def test_compose_file_is_valid():
    result = _compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_compose_defines_the_whole_stack():
    result = _compose("config", "--services")
    assert result.returncode == 0, result.stderr
    services = set(result.stdout.split())
    assert services == {"kafka", "clickhouse", "prometheus", "grafana"} | JOBWHEEL_SERVICES


def _commands() -> dict[str, list[str]]:
    """Each service's `command: [...]` (written as JSON-style flow lists in the file)."""
    out: dict[str, list[str]] = {}
    service = None
    for line in COMPOSE_FILE.read_text().splitlines():
        if match := re.fullmatch(r"  ([a-z]+):", line):
            service = match.group(1)
        elif service and (match := re.fullmatch(r"    command: (\[.*\])", line)):
            out[service] = json.loads(match.group(1))
    return out


@pytest.mark.parametrize("service", sorted(JOBWHEEL_SERVICES))
def test_service_command_is_a_jobwheel_command(service: str):
    command = _commands()[service]
    assert command[0] == "jobwheel"
    args = build_parser().parse_args(command[1:])  # exits (fails) on an unknown command/flag
    assert callable(args.handler)


def test_the_stack_refuses_to_start_without_its_secrets():
    for name in SECRETS:
        missing = {k: v for k, v in SECRETS.items() if k != name}
        result = _compose("config", "-q", secrets=missing)
        assert result.returncode != 0, name
        assert "see the top of docker-compose.yml" in result.stderr, name


def test_ports_are_published_on_loopback_only():
    ports = re.findall(r"^\s+- \"?([^\"\s]+)\"?$", COMPOSE_FILE.read_text(), re.MULTILINE)
    published = [p for p in ports if re.fullmatch(r"[0-9.:]+", p)]
    assert len(published) == 5, published
    assert all(p.startswith("127.0.0.1:") for p in published), published


def test_each_service_has_its_own_kafka_role_and_the_api_a_token():
    services = _services()
    roles = {
        "scheduler": "jobwheel-scheduler",
        "worker": "jobwheel-worker",
        "sink": "jobwheel-sink",
        "api": "jobwheel-submitter",
    }
    for service, user in roles.items():
        block = services[service]
        assert f'"sasl.username": "{user}"' in block, service
        assert "SCRAM-SHA-512" in block
        for other in set(roles.values()) - {user}:
            assert other not in block, (service, other)
    for service in ("topics", "acls"):
        assert '"sasl.username": "admin"' in services[service]
    assert "JOBWHEEL_API_TOKEN: api-token-1" in services["api"]
    assert (
        "JOBWHEEL_CLICKHOUSE_SQL_URL: http://jobwheel_sql:sql-pw-1@clickhouse:8123"
        in (services["api"])
    )
    kafka = services["kafka"]
    assert (
        "KAFKA_AUTHORIZER_CLASS_NAME: org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        in kafka
    )
    assert re.search(r"KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND: ['\"]?false['\"]? ", kafka)
    assert "PLAINTEXT:PLAINTEXT" not in kafka and ":PLAINTEXT," not in kafka


def test_the_sql_user_of_clickhouse_only_reads_the_jobwheel_database():
    root = ET.parse(COMPOSE_FILE.parent / "clickhouse" / "users.d" / "jobwheel_sql.xml").getroot()
    profile = root.find("profiles/jobwheel_sql")
    user = root.find("users/jobwheel_sql")
    assert profile is not None and user is not None
    assert profile.findtext("readonly") in ("1", "2")
    assert [q.text for q in user.findall("grants/query")] == ["GRANT SELECT ON jobwheel.*"]
    assert user.find("password").get("from_env") == "JOBWHEEL_CLICKHOUSE_SQL_PASSWORD"  # type: ignore[union-attr]


def test_services_reach_kafka_and_clickhouse_by_service_name():
    text = COMPOSE_FILE.read_text()
    assert "JOBWHEEL_BOOTSTRAP_SERVERS: kafka:9092" in text
    assert "JOBWHEEL_CLICKHOUSE_URL: http://clickhouse:8123" in text
    assert "image: apache/kafka:4.1.1" in text


#: The services that run until stopped (the others are one-shot commands).
LONG_RUNNING = {"scheduler", "worker", "sink", "api"}


def test_prometheus_scrapes_every_long_running_service_where_it_serves_metrics():
    """Each long-running service serves /metrics on JOBWHEEL_METRICS_PORT on every interface
    of its container, checks its readiness there, and Prometheus scrapes each of them, every
    replica (DNS discovery of the service name), on that port."""
    services = _services()
    for name in LONG_RUNNING:
        block = services[name]
        assert "JOBWHEEL_METRICS_PORT: '9400'" in block or 'JOBWHEEL_METRICS_PORT: "9400"' in (
            block
        ), name
        assert "JOBWHEEL_METRICS_HOST: 0.0.0.0" in block, name
        assert "http://127.0.0.1:9400/health/ready" in block, name
    config = (COMPOSE_FILE.parent / "prometheus" / "prometheus.yml").read_text()
    jobs = re.split(r"^  - job_name: ", config, flags=re.MULTILINE)[1:]
    scraped = {}
    for job in jobs:  # the file's own simple layout (no YAML parser among the dependencies)
        name = job.split()[0]
        names = re.findall(r"^ +- names: \[(.*)\]$", job, re.MULTILINE)
        ports = re.findall(r"^ +port: (\d+)$", job, re.MULTILINE)
        scraped[name] = (names, ports)
    assert scraped == {name: ([name], ["9400"]) for name in LONG_RUNNING}
    mounted = f"{COMPOSE_FILE.parent}/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
    assert mounted in services["prometheus"]  # the resolved config names the absolute path


def test_grafana_provisions_both_dashboards_and_their_datasources():
    from jobwheel.consumers.status import queries
    from jobwheel.deploy import grafana

    provisioning = COMPOSE_FILE.parent / "grafana" / "provisioning" / "datasources"
    prometheus = (provisioning / "prometheus.yaml").read_text()
    assert f"uid: {grafana.DATASOURCE['uid']}" in prometheus
    assert "url: http://prometheus:9090" in prometheus
    dashboards = COMPOSE_FILE.parent / "grafana" / "dashboards"
    uids = {json.loads(p.read_text())["uid"] for p in dashboards.glob("*.json")}
    assert uids == {queries.grafana_dashboard()["uid"], grafana.dashboard()["uid"]}


@pytest.mark.parametrize("service", ["scheduler", "worker", "sink", "api"])
def test_a_long_running_service_is_restarted_when_it_exits(service: str):
    """A scheduler or sink whose Kafka call hung past its deadline exits (code 75,
    jobwheel.watchdog) and counts on being started again; Docker restarts on exit, not on an
    unhealthy check."""
    assert "restart: unless-stopped" in _services()[service]


def test_the_compose_broker_has_the_local_brokers_group_and_transaction_timing() -> None:
    """The scheduler's failover time rests on the broker allowing its short group session
    (and aborting a dead scheduler's transaction promptly): the Compose broker sets what the
    local broker sets, read from the one place that says it (server_properties)."""
    from jobwheel.deploy.broker import server_properties

    props = dict(
        line.split("=", 1)
        for line in server_properties(port=1, controller_port=2, log_dirs=Path("/x")).splitlines()
        if "=" in line and not line.startswith("#")
    )
    text = COMPOSE_FILE.read_text()
    keys = [k for k in props if k.startswith(("group.consumer.", "group.min.session"))]
    keys.append("transaction.abort.timed.out.transaction.cleanup.interval.ms")
    assert len(keys) >= 5
    for key in keys:
        env = "KAFKA_" + key.upper().replace(".", "_")
        found = re.search(rf"^\s+{env}: \"([^\"]*)\"$", text, re.M)
        assert found, f"{env} is not set in {COMPOSE_FILE.name}"
        assert found.group(1) == props[key], (env, found.group(1), props[key])
