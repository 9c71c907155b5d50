"""What each Kafka role may do (pure; tests/integration/test_kafka_acls.py proves it on a
real SASL broker), and the secure broker's properties."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwheel.deploy.acls import ROLES, role_grants, username
from jobwheel.deploy.broker import (
    BrokerTls,
    client_credentials,
    ensure_broker_keystore,
    merge_properties,
    secure_overrides,
    server_properties,
    tls_transport,
    transport_of,
)
from jobwheel.errors import ConfigError
from jobwheel.settings import Settings

SETTINGS = Settings(_env_file=None, topic_prefix="jw", scheduler_app_id="jw-sched")  # type: ignore[call-arg]


def _rights(role: str) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for g in role_grants(SETTINGS, role):
        out.setdefault((g.resource, g.name + ("*" if g.prefixed else "")), set()).update(
            g.operations
        )
    return out


def _writes(role: str) -> set[str]:
    return {
        name for (kind, name), ops in _rights(role).items() if kind == "TOPIC" and "WRITE" in ops
    }


def test_each_role_writes_only_its_topics() -> None:
    assert _writes("submitter") == {"jw.requests"}
    assert _writes("worker") == {"jw.acks", "jw.workers"}
    assert _writes("sink") == set()
    assert _writes("api") == {"jw.requests"}
    assert _writes("scheduler") == {
        "jw.runs",
        "jw.status",
        "jw.dead-letter",
        "jw-sched-*",
    }


def test_the_workers_roster_is_written_by_workers_and_read_by_who_submits() -> None:
    """Workers announce their tasks there; submit, the SDK and the API read it to warn about
    a task no live worker serves."""
    for role in ("submitter", "api"):
        assert _rights(role)[("TOPIC", "jw.workers")] == {"READ", "DESCRIBE"}
    assert _rights("worker")[("TOPIC", "jw.workers")] == {"WRITE", "DESCRIBE"}
    # the scheduler only sees that it exists (its check of every topic at start)
    assert _rights("scheduler")[("TOPIC", "jw.workers")] == {"DESCRIBE"}


def test_no_role_administers_the_cluster() -> None:
    for role in ROLES:
        for (kind, name), ops in _rights(role).items():
            assert kind in ("TOPIC", "GROUP", "TRANSACTIONAL_ID")
            if (role, kind, name) == ("scheduler", "GROUP", SETTINGS.scheduler_app_id):
                # The scheduler sets its own group's session timing (KIP-848 group configs).
                ops = ops - {"ALTER_CONFIGS", "DESCRIBE_CONFIGS"}
            assert ops <= {"READ", "WRITE", "DESCRIBE"}, (role, ops)


def test_groups_and_transactional_ids() -> None:
    assert _rights("worker")[("GROUP", SETTINGS.worker_group)] == {"READ", "DESCRIBE"}
    assert _rights("sink")[("GROUP", SETTINGS.status_group)] == {"READ", "DESCRIBE"}
    assert _rights("scheduler")[("TRANSACTIONAL_ID", "jw-sched*")] == {"WRITE", "DESCRIBE"}
    assert all(kind != "TRANSACTIONAL_ID" for kind, _ in _rights("worker"))


def test_principals_are_per_prefix_and_role() -> None:
    assert username(SETTINGS, "worker") == "jw-worker"
    with pytest.raises(ConfigError, match="unknown role"):
        role_grants(SETTINGS, "root")


def test_secure_properties_keep_the_base_and_replace_the_listeners(tmp_path: Path) -> None:
    base = server_properties(port=9092, controller_port=9093, log_dirs=tmp_path)
    tls = BrokerTls(tmp_path / "broker.pem", tmp_path / "ca.pem")
    merged = merge_properties(
        base, secure_overrides(port=9092, controller_port=9093, admin_password="pw", tls=tls)
    )
    props = dict(
        line.split("=", 1) for line in merged.splitlines() if line and not line.startswith("#")
    )
    for line in base.splitlines():  # every base setting is still there (or overridden)
        if line and not line.startswith("#"):
            assert line.split("=", 1)[0] in props
    # every listener, the controller's too, is SASL over TLS: nothing in clear
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["listener.security.protocol.map"] == "CONTROLLER:SASL_SSL,SASL_SSL:SASL_SSL"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["ssl.keystore.location"] == str(tls.keystore)
    assert props["ssl.truststore.location"] == str(tls.ca_cert)
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"
    assert len(merged.splitlines()) == len(set(merged.splitlines()))


def test_each_node_certificate_is_signed_by_the_one_ca_and_names_the_host(
    tmp_path: Path,
) -> None:
    from cryptography import x509

    nodes = [ensure_broker_keystore(tmp_path / f"node{n}", tmp_path) for n in (1, 2)]
    assert nodes[0].ca_cert == nodes[1].ca_cert == tmp_path / "tls" / "ca.pem"
    ca = x509.load_pem_x509_certificate(nodes[0].ca_cert.read_bytes())
    leaves = [x509.load_pem_x509_certificates(n.keystore.read_bytes())[0] for n in nodes]
    assert leaves[0].serial_number != leaves[1].serial_number
    for node, leaf in zip(nodes, leaves, strict=True):
        leaf.verify_directly_issued_by(ca)
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "127.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
        assert b"-----BEGIN PRIVATE KEY-----" in node.keystore.read_bytes()  # PKCS#8
        assert oct(node.keystore.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "tls" / "ca.key").stat().st_mode & 0o777) == "0o600"
    # made once: a restart keeps the same CA and the same keystores
    again = ensure_broker_keystore(tmp_path / "node1", tmp_path)
    assert again.keystore.read_bytes() == nodes[0].keystore.read_bytes()


def test_a_role_reaches_the_cluster_as_the_admin_does() -> None:
    admin = client_credentials("admin", "pw", tls_transport(Path("/ca.pem")))
    assert admin["security.protocol"] == "SASL_SSL" and admin["ssl.ca.location"] == "/ca.pem"
    role = client_credentials("jw-worker", "secret", transport_of(admin))
    assert role == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": "/ca.pem",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "jw-worker",
        "sasl.password": "secret",
    }
    # an admin on SASL without TLS (the Compose stack) gives its roles the same
    plain = client_credentials("admin", "pw")
    assert client_credentials("r", "s", transport_of(plain))["security.protocol"] == (
        "SASL_PLAINTEXT"
    )
