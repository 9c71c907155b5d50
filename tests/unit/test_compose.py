"""deploy/compose/docker-compose.yml is valid Compose and runs real jobwheel commands."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobwheel.cli import build_parser

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "docker-compose.yml"
JOBWHEEL_SERVICES = {"topics", "scheduler", "worker", "sink", "api"}


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


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [*_validator(), "-f", str(COMPOSE_FILE), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_compose_file_is_valid():
    result = _compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_compose_defines_the_whole_stack():
    result = _compose("config", "--services")
    assert result.returncode == 0, result.stderr
    services = set(result.stdout.split())
    assert services == {"kafka", "clickhouse", "grafana"} | JOBWHEEL_SERVICES


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


def test_services_reach_kafka_and_clickhouse_by_service_name():
    text = COMPOSE_FILE.read_text()
    assert "JOBWHEEL_BOOTSTRAP_SERVERS: kafka:9092" in text
    assert "JOBWHEEL_CLICKHOUSE_URL: http://clickhouse:8123" in text
    assert "image: apache/kafka:4.1.1" in text
