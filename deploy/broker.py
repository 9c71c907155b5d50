"""A genuine single-node Apache Kafka (KRaft) broker without Docker, run from Maven jars.

There is no Docker engine on the development and CI machines, but Maven Central serves the
broker as jars (``deploy/pom.xml``). :class:`LocalBroker` fetches them once into ``deploy/lib``,
formats KRaft storage once per data directory, and runs ``java ... kafka.Kafka`` as a detached
process (own session, pid file, output to files) so ``jobwheel broker start`` can return and a
later ``jobwheel broker stop`` can find it again through the data directory alone.

Everything about one broker lives in its data directory::

    server.properties   the config it runs with (ports are read back from it by status/stop)
    broker.pid          pid of the running JVM
    broker.out          JVM stdout/stderr (startup crashes that happen before logging)
    logs/server.log     the broker's own log (deploy/log4j2.yaml)
    kraft/              log.dirs: metadata log and topic data
    admin.json          secure brokers only: the admin's client config (mode 0600)

    tls/                secure brokers only: the CA (ca.pem, ca.key) and this broker's keystore

``secure=True`` (``jobwheel broker start --secure``) runs it with SASL/SCRAM-SHA-512 over TLS
(SASL_SSL) on every listener and the standard authorizer (:func:`secure_overrides`); the admin
principal's SCRAM credential is created when the storage is formatted, the CA and the broker's
certificate at the first start (:func:`ensure_ca`, :func:`ensure_broker_keystore`). A data dir
stays secure once it is.
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import contextlib
import ctypes
import datetime
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwheel.errors import BrokerError, ConfigError
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

DEPLOY_DIR = Path(__file__).resolve().parent
POM = DEPLOY_DIR / "pom.xml"
LIB_DIR = DEPLOY_DIR / "lib"
LOG4J2_CONFIG = DEPLOY_DIR / "log4j2.yaml"
#: Written into LIB_DIR after a complete fetch; holds the sha256 of the pom it was fetched from,
#: so a pom change (new Kafka version) triggers a re-fetch. The Makefile writes the same stamp.
STAMP = ".fetched"
MAIN_CLASS = "kafka.Kafka"
MVN_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
MIN_JAVA = 17
HOST = "127.0.0.1"
NODE_ID = 1


class BrokerStartError(BrokerError):
    """The broker process exited or never answered during startup. Carries its log tail."""


def mvn_command(pom: Path = POM, lib_dir: Path = LIB_DIR) -> list[str]:
    """The one command that fetches the broker jars (the Makefile runs the same)."""
    # -DoutputDirectory must be absolute: a relative one is resolved against the pom's folder.
    return [
        "mvn",
        "-B",
        "-q",
        "-f",
        str(pom.resolve()),
        MVN_PLUGIN,
        "-DincludeScope=runtime",
        f"-DoutputDirectory={lib_dir.resolve()}",
    ]


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _pom_versions(pom: Path) -> dict[str, str]:
    text = pom.read_text()
    return dict(re.findall(r"<(kafka\.version|log4j\.version)>([^<]+)<", text))


def _expected_jars(pom: Path) -> list[str]:
    versions = _pom_versions(pom)
    kafka, log4j = versions.get("kafka.version", ""), versions.get("log4j.version", "")
    return [
        f"kafka_2.13-{kafka}.jar",
        f"kafka-server-{kafka}.jar",
        f"kafka-clients-{kafka}.jar",
        f"kafka-metadata-{kafka}.jar",
        f"kafka-raft-{kafka}.jar",
        f"log4j-core-{log4j}.jar",
        f"log4j-slf4j-impl-{log4j}.jar",
    ]


def jars_complete(lib_dir: Path = LIB_DIR, pom: Path = POM) -> bool:
    """True when ``lib_dir`` holds a finished fetch of this very pom."""
    stamp = lib_dir / STAMP
    if not stamp.is_file() or stamp.read_text().strip() != _pom_digest(pom):
        return False
    return all((lib_dir / jar).is_file() for jar in _expected_jars(pom))


def ensure_jars(lib_dir: Path = LIB_DIR, pom: Path = POM) -> Path:
    """Fetch the broker jars with Maven unless a complete fetch is already there.

    A file lock serialises concurrent callers (several test sessions on one machine), and
    stale jars are removed first so two Kafka versions never share a classpath.
    """
    if jars_complete(lib_dir, pom):
        return lib_dir
    if shutil.which("mvn") is None:
        raise ConfigError(
            f"the Kafka broker jars are missing in {lib_dir} and Maven is not installed: "
            "install Maven 3.8+ (Debian: apt-get install maven) or run `make setup` on a machine "
            "that has it"
        )
    lib_dir.mkdir(parents=True, exist_ok=True)
    with open(lib_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if jars_complete(lib_dir, pom):
            return lib_dir
        for old in lib_dir.glob("*.jar"):
            old.unlink()
        cmd = mvn_command(pom, lib_dir)
        log.info("fetching Kafka broker jars", extra={"command": " ".join(cmd)})
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr).strip()[-3000:]
            raise ConfigError(
                f"fetching the Kafka broker jars failed (exit {proc.returncode}): "
                f"{' '.join(cmd)}\n{out}\nMaven Central must be reachable."
            )
        missing = [jar for jar in _expected_jars(pom) if not (lib_dir / jar).is_file()]
        if missing:
            raise ConfigError(f"Maven finished but {lib_dir} lacks {', '.join(missing)}")
        (lib_dir / STAMP).write_text(_pom_digest(pom) + "\n")
    return lib_dir


def java_version(java: str) -> int:
    """The major version of ``java`` (``java -version`` prints it on stderr)."""
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if not match:
        raise ConfigError(f"could not read the Java version from `{java} -version`")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ConfigError(
            f"Java is not installed: the local Kafka broker needs Java {MIN_JAVA}+ "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    major = java_version(java)
    if major < MIN_JAVA:
        raise ConfigError(
            f"{java} is Java {major}; Kafka 4 needs Java {MIN_JAVA}+ "
            "(Debian: apt-get install openjdk-17-jre-headless, then put it first on PATH)"
        )
    return java


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a server could bind ``host:port`` now (SO_REUSEADDR like the JVM's listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


#: Where :func:`free_port` looks: above the well-known and common service ports, below
#: Linux's default ephemeral range (32768-60999).
FREE_PORT_RANGE = (20_000, 32_767)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux default when unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


#: The ports :func:`free_port` handed out lately (the oldest leave first).
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=256)


def free_port(host: str = HOST) -> int:
    """A port a server could bind right now (another process may still take it), outside the
    kernel's ephemeral range.

    Why not the kernel's pick (bind to port 0): that comes from the ephemeral range, the same
    ports outgoing connections use as their source port. While a broker on such a port is
    stopped, a client retrying ``127.0.0.1:port`` can be given that very port as its source
    and connect to itself (TCP simultaneous open); the broker then cannot bind its port when
    it starts again. Random picks from :data:`FREE_PORT_RANGE` (minus the ephemeral range, if
    the host's overlaps it) avoid that, and processes picking at once rarely collide.

    A port handed out lately by this process is not handed out again: callers ask for a
    broker's listener and controller ports one after the other before either is bound, and
    two random picks were once the same port (a fresh-clone test run failed on it).
    """
    low, high = FREE_PORT_RANGE
    eph_low, eph_high = ephemeral_ports()
    recent = set(_HANDED_OUT)
    candidates = [
        p for p in range(low, high + 1) if not eph_low <= p <= eph_high and p not in recent
    ]
    for port in secrets.SystemRandom().sample(candidates, min(200, len(candidates))):
        if port_free(port, host):
            _HANDED_OUT.append(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))  # the whole range is taken: the kernel's pick is better than none
        return int(sock.getsockname()[1])


def new_cluster_id() -> str:
    """A Kafka ``Uuid`` string: URL-safe base64 of 16 random bytes, never starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def replication_of(nodes: int) -> tuple[int, int]:
    """``(replication factor, min.insync.replicas)`` of a cluster of ``nodes`` brokers.

    Three replicas, two of which must have a write before it is acknowledged, is what a
    production cluster runs: one broker may be down (restart, upgrade) while writes go on, and
    an acknowledged write survives losing any one broker. Fewer brokers cannot hold three
    copies, and a min ISR of 2 on 2 replicas would stop writes whenever one broker is down.
    """
    factor = min(3, max(1, nodes))
    return factor, 2 if factor >= 3 else 1


def server_properties(
    *,
    port: int,
    controller_port: int,
    log_dirs: Path,
    host: str = HOST,
    node_id: int = NODE_ID,
    voters: Sequence[tuple[int, int]] | None = None,
) -> str:
    """The KRaft config of one node, alone (``voters`` None) or in a cluster.

    ``voters`` lists ``(node id, controller port)`` of every node of a cluster on this host,
    each broker and controller at once (a static quorum: the voters never change, and it starts
    faster than a dynamic one). Kafka's defaults assume three nodes (offsets/transaction topics
    with replication factor 3, min ISR 2): on one node consumer groups and transactions would
    just fail, so the internal topics are sized by :func:`replication_of`. They get few
    partitions because creating 50 of them is most of a cold start on 2 cores. Auto-creation is
    off: a topic made by a stray producer would have 1 partition and break the co-partitioning
    of requests/runs/acks/status, so topics come from ``topics ensure``.
    """
    quorum = list(voters) if voters else [(node_id, controller_port)]
    factor, min_isr = replication_of(len(quorum))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(f"{n}@{host}:{c}" for n, c in quorum),
        "controller.listener.names": "CONTROLLER",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dirs.resolve()),
        "offsets.topic.replication.factor": str(factor),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        # Topics created without their own settings (jobwheel's own set theirs).
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(min_isr),
        # Kafka's default, said out loud: a replica that missed acknowledged writes never
        # becomes leader, so a write acknowledged by min.insync.replicas brokers is never lost
        # (a partition whose in-sync replicas are all gone stays offline instead).
        "unclean.leader.election.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # The new consumer group protocol (KIP-848) keeps member timing on the broker: members
        # learn of new assignments in heartbeat responses, so a 1 s heartbeat moves partitions
        # within about a second (5 s by default), and a dead member's partitions move after
        # the 10 s session timeout (45 s by default). The scheduler sets its own group's
        # timing (JOBWHEEL_SCHEDULER_SESSION_TIMEOUT_MS); the minimums allow it.
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.session.timeout.ms": "10000",
        "group.consumer.min.session.timeout.ms": "3000",
        "group.min.session.timeout.ms": "3000",
        # A scheduler killed mid-transaction leaves it open until transaction.timeout.ms; the
        # broker looks for such transactions every 10 s by default, which would add up to 10 s
        # before read_committed readers (workers, a restoring scheduler) see past it.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
    }
    lines = ["# Written by jobwheel (deploy/broker.py) on every start; edits are overwritten."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


#: The superuser of a secure broker: the broker itself, `topics ensure` and `acls apply`.
ADMIN_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The client listener of a secure broker, also its inter-broker listener: SASL over TLS.
SECURE_LISTENER = "SASL_SSL"
#: Where a secure broker (or cluster) keeps its CA and a node its keystore.
TLS_DIR = "tls"
CA_CERT = "ca.pem"
CERT_VALIDITY_DAYS = 3650


@dataclass(frozen=True)
class BrokerTls:
    """The TLS material one secure node runs with: its keystore (its key and certificate,
    signed by the CA) and the CA certificate it trusts peers by."""

    keystore: Path
    ca_cert: Path


def secure_overrides(
    *, port: int, controller_port: int, admin_password: str, tls: BrokerTls, host: str = HOST
) -> dict[str, str]:
    """What :func:`server_properties` gets on top for a secure broker (one node or each node
    of a cluster: the same keys, only ports and keystores differ).

    Clients authenticate with SCRAM-SHA-512 on the one client listener, which is also the
    inter-broker listener (replication and transaction markers go broker to broker) as the
    admin. The controller listener uses SASL/PLAIN with the admin as its only user: SCRAM
    credentials live in the metadata log the controller serves, so the controller cannot use
    them itself, and a PLAINTEXT controller listener would let anyone who reaches it act as
    the broker. Both run over TLS (SASL_SSL): passwords (PLAIN sends them as they are) and
    records never cross the wire in clear, and a client (or a node) that does not trust the
    CA, or speaks plaintext, is refused at the handshake. Every node's certificate names the
    host, and peers verify it (Kafka's default ``ssl.endpoint.identification.algorithm``).
    The standard KRaft authorizer denies whatever no ACL allows (``jobwheel acls apply``
    grants each role its part); only the admin is a superuser.
    """
    user = ADMIN_USER
    scram_jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{admin_password}";'
    )
    plain_jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{admin_password}" user_{user}="{admin_password}";'
    )
    listener = SECURE_LISTENER.lower()
    return {
        "listeners": f"{SECURE_LISTENER}://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"{SECURE_LISTENER}://{host}:{port}",
        "inter.broker.listener.name": SECURE_LISTENER,
        "listener.security.protocol.map": f"CONTROLLER:SASL_SSL,{SECURE_LISTENER}:SASL_SSL",
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        "sasl.mechanism.controller.protocol": "PLAIN",
        f"listener.name.{listener}.sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.{listener}.scram-sha-512.sasl.jaas.config": scram_jaas,
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain_jaas,
        # One keystore and one trust store for every listener, served and dialled alike (a
        # PEM keystore has no password: the file is its owner's only, as this config is).
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_cert),
        "ssl.endpoint.identification.algorithm": "https",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{user}",
        "allow.everyone.if.no.acl.found": "false",
    }


def _crypto() -> Any:
    """The ``cryptography`` package (the ``all`` extra; the status and registry extras pull it
    too), or an error that says what to install."""
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "a secure broker makes its CA and certificates with the `cryptography` package, "
            "which is not installed: pip install 'jobwheel[all]' (or cryptography)"
        ) from exc
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner only (a private key), replacing ``path`` at once."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def _certificate(
    subject: str,
    public_key: Any,
    issuer: tuple[str, Any] | None,
    own_key: Any,
    *,
    ca: bool,
    hosts: Sequence[str] = (),
) -> Any:
    """A certificate for ``subject``, signed by ``issuer`` (name, key) or self-signed."""
    x509, hashes, _, _, eku, name_oid = _crypto()
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signing_key = issuer or (subject, own_key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, issuer_name)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CERT_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), True)
    )
    if ca:
        usage = {"key_cert_sign": True, "crl_sign": True, "digital_signature": True}
    else:
        usage = {"key_cert_sign": False, "crl_sign": False, "digital_signature": True}
        names: list[Any] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([eku.SERVER_AUTH, eku.CLIENT_AUTH]), False
        )
    builder = builder.add_extension(
        x509.KeyUsage(
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            encipher_only=False,
            decipher_only=False,
            **usage,
        ),
        True,
    )
    return builder.sign(signing_key, hashes.SHA256())


def ensure_ca(secrets_dir: Path) -> Path:
    """The CA of a secure broker or cluster: its key in ``<secrets_dir>/tls/ca.key`` (mode
    0600), its certificate (what clients trust: ``ssl.ca.location``) in ``tls/ca.pem``. Made
    once, under a lock (the nodes of a cluster are prepared at once); returns the certificate.

    Why a CA of its own rather than one self-signed certificate per node: every node and every
    client trusts the one CA file, so a node's certificate can be made (or remade) alone."""
    _, _, serialization, ec, _, _ = _crypto()
    tls_dir = secrets_dir / TLS_DIR
    tls_dir.mkdir(parents=True, exist_ok=True)
    ca_cert = tls_dir / CA_CERT
    with open(tls_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ca_cert.is_file() and (tls_dir / "ca.key").is_file():
            return ca_cert
        key = ec.generate_private_key(ec.SECP256R1())
        name = f"jobwheel local CA {uuid.uuid4().hex[:8]}"
        cert = _certificate(name, key.public_key(), None, key, ca=True)
        _write_private(
            tls_dir / "ca.key",
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        partial = ca_cert.with_suffix(".tmp")
        partial.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        partial.replace(ca_cert)
    log.info("TLS CA created", extra={"ca": str(ca_cert)})
    return ca_cert


def ensure_broker_keystore(data_dir: Path, ca_dir: Path, host: str = HOST) -> BrokerTls:
    """A node's keystore, ``<data_dir>/tls/broker.pem`` (mode 0600): its key (PKCS#8, as
    Kafka's PEM keystore reads it) and its certificate for ``host`` and localhost, signed by
    the CA of ``ca_dir`` (:func:`ensure_ca`), for serving and for dialling the other nodes.
    Made once per node."""
    x509, _, serialization, ec, _, _ = _crypto()
    ca_cert = ensure_ca(ca_dir)
    tls_dir = data_dir / TLS_DIR
    tls_dir.mkdir(parents=True, exist_ok=True)
    store = tls_dir / "broker.pem"
    if store.is_file():
        return BrokerTls(store, ca_cert)
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key((ca_cert.parent / "ca.key").read_bytes(), None)
    ca_name = ca.subject.rfc4514_string().removeprefix("CN=")
    key = ec.generate_private_key(ec.SECP256R1())
    hosts = [host] + (["localhost"] if host != "localhost" else [])
    cert = _certificate(host, key.public_key(), (ca_name, ca_key), key, ca=False, hosts=hosts)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pem += cert.public_bytes(serialization.Encoding.PEM) + ca_cert.read_bytes()
    _write_private(store, pem)
    return BrokerTls(store, ca_cert)


def merge_properties(text: str, overrides: dict[str, str]) -> str:
    """``text`` (a properties file) with ``overrides``: keys replaced in place, new ones added."""
    lines, seen = [], set()
    for line in text.splitlines():
        key = line.partition("=")[0].strip()
        if line and not line.startswith("#") and key in overrides:
            lines.append(f"{key}={overrides[key]}")
            seen.add(key)
        else:
            lines.append(line)
    lines += [f"{key}={value}" for key, value in overrides.items() if key not in seen]
    return "\n".join(lines) + "\n"


def client_credentials(
    username: str, password: str, transport: dict[str, str] | None = None
) -> dict[str, str]:
    """The librdkafka settings of a SCRAM principal (``JOBWHEEL_KAFKA_CONFIG``).

    ``transport`` is how the cluster is reached: ``security.protocol`` and the ``ssl.*`` keys
    (:func:`tls_transport` for a local secure broker; an admin's own, for the roles ``jobwheel
    acls apply`` writes); SASL over plaintext without it."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        **(transport or {}),
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": username,
        "sasl.password": password,
    }


def tls_transport(ca_cert: Path) -> dict[str, str]:
    """How a client reaches a local secure broker: SASL over TLS, trusting its CA only."""
    return {"security.protocol": SECURE_LISTENER, "ssl.ca.location": str(ca_cert)}


def transport_of(config: dict[str, Any]) -> dict[str, str]:
    """The part of a client config that says how the cluster is reached (not who): its SASL
    ``security.protocol`` and its ``ssl.*`` keys, which every principal of a cluster shares."""
    out = {k: str(v) for k, v in config.items() if k.startswith("ssl.")}
    protocol = str(config.get("security.protocol", ""))
    if protocol.upper().startswith("SASL_"):
        out["security.protocol"] = protocol
    return out


def write_secret_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` readable by its owner only (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(value, out, indent=2)
        out.write("\n")
    tmp.replace(path)


def _read_properties(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _alive(pid: int) -> bool:
    """Running and not a zombie (a zombie still answers kill(pid, 0))."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _child_setup(die_with_parent: bool, cgroup: Path | None) -> Callable[[], None] | None:
    """What the broker's child does between fork and exec (None: nothing)."""
    if not die_with_parent and cgroup is None:
        return None
    procs = None if cgroup is None else str(cgroup / "cgroup.procs")

    def setup() -> None:  # pragma: no cover - runs in the child between fork and exec
        if procs is not None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        if die_with_parent:
            _die_with_parent()

    return setup


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this child when the process that started it dies (tests, ``up``)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str | None
    data_dir: Path
    ready: bool = False

    def describe(self) -> str:
        if not self.running:
            return (
                f"broker not running: none found in {self.data_dir} (to look elsewhere, set "
                "JOBWHEEL_DATA_DIR to the stack's data dir, or pass --data-dir DIR/kafka)"
            )
        state = "ready" if self.ready else "not answering yet"
        return (
            f"broker running, {state}: bootstrap {self.bootstrap}, pid {self.pid}, "
            f"data dir {self.data_dir}"
        )


class LocalBroker:
    """One KRaft broker (and controller), identified by its data directory: a single-node
    broker, or one node of a :class:`LocalCluster` (``node_id``, ``voters``, ``cluster_id``)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 9092,
        controller_port: int = 9093,
        heap: str = "512m",
        lib_dir: Path = LIB_DIR,
        host: str = HOST,
        startup_timeout_s: float = 120.0,
        secure: bool = False,
        node_id: int = NODE_ID,
        voters: Sequence[tuple[int, int]] | None = None,
        cluster_id: str | None = None,
        secrets_dir: Path | None = None,
        jvm_options: Sequence[str] = (),
    ) -> None:
        """``secrets_dir`` holds the admin's client config and the CA (a cluster's nodes share
        its own dir); the broker's data dir by default. ``jvm_options`` are added to the JVM's
        own (``JOBWHEEL_BROKER_JVM_OPTIONS``)."""
        self.data_dir = Path(data_dir).resolve()
        self.secrets_dir = Path(secrets_dir).resolve() if secrets_dir else self.data_dir
        self.node_id = node_id
        self.voters = list(voters) if voters else None
        self.cluster_id = cluster_id
        # once secure, always: the data dir holds the admin credential and the ACLs
        self.secure = secure or self.admin_config_path.is_file()
        self.port = port
        self.controller_port = controller_port
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self.lib_dir = lib_dir
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        secure: bool = False,
    ) -> LocalBroker:
        """The broker of ``settings`` (data in ``<data_dir>/kafka``), CLI flags winning."""
        return cls(
            data_dir or settings.data_dir / "kafka",
            port=port or settings.broker_port,
            controller_port=controller_port or settings.broker_controller_port,
            heap=settings.broker_heap,
            secure=secure,
            jvm_options=settings.broker_jvm_args,
        )

    # --- paths -------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def out_path(self) -> Path:
        return self.data_dir / "broker.out"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / "kraft"

    @property
    def admin_config_path(self) -> Path:
        return self.secrets_dir / "admin.json"

    @property
    def ca_cert_path(self) -> Path:
        """The CA certificate a client of a secure broker trusts (``ssl.ca.location``)."""
        return self.secrets_dir / TLS_DIR / CA_CERT

    def admin_config(self) -> dict[str, str]:
        """The admin's librdkafka settings (secure brokers; {} otherwise)."""
        if not self.secure:
            return {}
        try:
            loaded = json.loads(self.admin_config_path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"the admin credentials of the secure broker in {self.data_dir} cannot be read "
                f"from {self.admin_config_path}: {exc}"
            ) from exc
        return {str(k): str(v) for k, v in loaded.items()}

    def client_config(self) -> dict[str, str]:
        """A confluent-kafka config that reaches this broker as its admin."""
        return {"bootstrap.servers": self.bootstrap, **self.admin_config()}

    def _ensure_admin_credentials(self) -> str:
        """The admin password, created with the storage (it is written into the metadata log
        when the storage is formatted, so it cannot be added to a data dir formatted without),
        and the admin's client config, rewritten on every start: a data dir made secure before
        its listeners had TLS gets the CA added to it."""
        if self.admin_config_path.is_file():
            password = self.admin_config()["sasl.password"]
        elif (self.log_dirs / "meta.properties").is_file():
            raise ConfigError(
                f"the broker data dir {self.data_dir} was created without --secure; its storage "
                "has no admin credential. Use a new data dir (--data-dir) for a secure broker"
            )
        else:
            password = secrets.token_urlsafe(32)
        config = client_credentials(ADMIN_USER, password, tls_transport(self.ca_cert_path))
        if not self.admin_config_path.is_file() or self.admin_config() != config:
            write_secret_json(self.admin_config_path, config)
        return password

    # --- lifecycle ---------------------------------------------------------------------------

    def running_pid(self) -> int | None:
        """The pid of this data dir's broker JVM, verified by its command line (pid reuse)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if self._proc is not None and self._proc.pid == pid and self._proc.poll() is not None:
            return None
        cmdline = _proc_cmdline(pid)
        if _alive(pid) and MAIN_CLASS in cmdline and str(self.properties_path) in cmdline:
            return pid
        return None

    def start(
        self, *, wait: bool = True, die_with_parent: bool = False, cgroup: Path | None = None
    ) -> float:
        """Start the broker detached; with ``wait`` return once it answers metadata.

        Returns the seconds it took. ``die_with_parent`` ties the JVM to this process (tests,
        the stack supervisor) so a killed parent does not leave an orphan broker behind.
        ``cgroup`` (a cgroup v2 directory) starts the JVM inside it, so every socket it opens
        belongs to it: an ``iptables -m cgroup`` rule can then cut the node off completely,
        which rules on its ports alone cannot (its own outgoing connections get through).
        """
        began = time.monotonic()
        pid = self.running_pid()
        if pid is not None:
            running = _read_properties(self.properties_path)
            listeners = running.get("advertised.listeners", "")
            if f"//{self.host}:{self.port}" not in listeners:
                raise ConfigError(
                    f"a broker for {self.data_dir} is already running (pid {pid}, {listeners}) "
                    f"on other ports than requested ({self.bootstrap}): stop it first with "
                    "`jobwheel broker stop`"
                )
            log.info("broker already running", extra={"pid": pid, "bootstrap": self.bootstrap})
            if wait:
                self.wait_ready()
            return time.monotonic() - began
        if self.voters is None and is_cluster_dir(self.data_dir):
            raise ConfigError(
                f"{self.data_dir} holds a local cluster ({CLUSTER_FILE}): start it with "
                "`jobwheel broker start --nodes N`, or give a single broker another --data-dir"
            )
        self._check_ports()
        java = self.prepare()
        cmd = self._java_command(java)
        with open(self.out_path, "ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                preexec_fn=_child_setup(die_with_parent, cgroup),
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        log.info(
            "broker starting",
            extra={
                "pid": self._proc.pid,
                "bootstrap": self.bootstrap,
                "data_dir": str(self.data_dir),
            },
        )
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop(timeout_s=5.0)
                raise
        return time.monotonic() - began

    def prepare(self) -> str:
        """Write the node's config and format its storage (once per data dir); returns the
        java to run it with. :meth:`start` does it too: a cluster calls it for all its nodes
        at once, as each format is a JVM start of its own."""
        java = find_java()
        ensure_jars(self.lib_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        properties = server_properties(
            port=self.port,
            controller_port=self.controller_port,
            log_dirs=self.log_dirs,
            host=self.host,
            node_id=self.node_id,
            voters=self.voters,
        )
        admin_password = None
        if self.secure:
            admin_password = self._ensure_admin_credentials()
            properties = merge_properties(
                properties,
                secure_overrides(
                    port=self.port,
                    controller_port=self.controller_port,
                    admin_password=admin_password,
                    tls=ensure_broker_keystore(self.data_dir, self.secrets_dir, self.host),
                    host=self.host,
                ),
            )
        # it may hold the admin password: readable by its owner only
        self.properties_path.touch(mode=0o600, exist_ok=True)
        self.properties_path.chmod(0o600)
        self.properties_path.write_text(properties)
        self._format_storage(java, admin_password)
        return java

    def _check_ports(self) -> None:
        for port, what, env in (
            (self.port, "listener", "JOBWHEEL_BROKER_PORT"),
            (self.controller_port, "controller", "JOBWHEEL_BROKER_CONTROLLER_PORT"),
        ):
            if not port_free(port, self.host):
                flag = "--port" if what == "listener" else "--controller-port"
                raise ConfigError(
                    f"port {port} ({what}) on {self.host} is already in use: stop whatever "
                    f"listens there, or pick another port with {env}=<port> (or {flag} <port>)"
                )
        if self.port == self.controller_port:
            raise ConfigError(
                f"the broker port and the controller port are both {self.port}: set "
                "JOBWHEEL_BROKER_CONTROLLER_PORT (or --controller-port) to another port"
            )

    def _format_storage(self, java: str, admin_password: str | None = None) -> None:
        """Format KRaft storage once per data dir (``meta.properties`` marks it done); a secure
        broker's admin SCRAM credential is part of the formatted metadata."""
        if (self.log_dirs / "meta.properties").is_file():
            return
        cmd = [
            java,
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            f"{self.lib_dir.resolve()}/*",
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id or new_cluster_id(),
            "-c",
            str(self.properties_path),
            "--ignore-formatted",
        ]
        if admin_password is not None:
            scram = f"{SCRAM_MECHANISM}=[name={ADMIN_USER},password={admin_password}]"
            cmd += ["--add-scram", scram]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip()[-3000:]
            if admin_password is not None:
                output = output.replace(admin_password, "***")
            raise BrokerStartError(
                f"formatting KRaft storage in {self.log_dirs} failed (exit {proc.returncode}):\n"
                f"{output}"
            )

    def _java_command(self, java: str) -> list[str]:
        return [
            java,
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            *self.jvm_options,
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            f"{self.lib_dir.resolve()}/*",
            MAIN_CLASS,
            str(self.properties_path),
        ]

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until the listener answers metadata with a live broker, or raise.

        A TCP connect is polled first: it is cheap and keeps librdkafka from logging
        connection-refused noise while the JVM boots. ``brokers`` in the metadata lists only
        unfenced brokers, so a non-empty answer means topics can be created.
        """
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while time.monotonic() < deadline:
            self._raise_if_dead()
            if self._accepts() and self._metadata_ok():
                return
            time.sleep(0.1)
        self._raise_if_dead()
        raise BrokerStartError(
            f"the broker at {self.bootstrap} did not answer within "
            f"{timeout_s or self.startup_timeout_s:.0f}s (pid file {self.pid_path}).\n"
            f"Last lines of {self.log_path}:\n{tail(self.log_path)}"
        )

    def _raise_if_dead(self) -> None:
        if self._proc is not None:
            code = self._proc.poll()
            if code is None:
                return
        elif self.running_pid() is not None:
            return
        else:
            code = None
        raise BrokerStartError(
            f"the Kafka broker for {self.data_dir} exited during startup"
            + (f" (exit code {code})" if code is not None else "")
            + f".\nLast lines of {self.log_path}:\n{tail(self.log_path)}"
            + f"\nLast lines of {self.out_path}:\n{tail(self.out_path, 20)}"
        )

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _metadata_ok(self, timeout_s: float = 2.0) -> bool:
        """The node answers metadata, listing itself: a cluster node that restarts serves
        requests only once the controller has unfenced it, and then it may lead partitions."""
        from jobwheel.kafka.admin import live_brokers

        return self.node_id in live_brokers(self.client_config(), timeout_s)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM (a clean shutdown), then SIGKILL after ``timeout_s``. False if not running."""
        pid = self.running_pid()
        if pid is None:
            if self._proc is not None:
                self._proc.poll()
            self.pid_path.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            log.warning("broker ignored SIGTERM; killing it", extra={"pid": pid})
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
        self.pid_path.unlink(missing_ok=True)
        log.info("broker stopped", extra={"pid": pid, "data_dir": str(self.data_dir)})
        return True

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return True
            elif not _alive(pid):
                return True
            time.sleep(0.05)
        return False

    def wait(self) -> int:
        """Wait for a broker started by this object to exit; returns its exit code."""
        if self._proc is None:
            raise BrokerError("wait() needs a broker started by this LocalBroker")
        return self._proc.wait()

    def status(self) -> BrokerStatus:
        """Whether this data dir's broker runs; bootstrap read from its own server.properties."""
        pid = self.running_pid()
        if pid is None:
            return BrokerStatus(False, None, None, self.data_dir)
        props = _read_properties(self.properties_path)
        advertised = props.get("advertised.listeners", "")
        bootstrap = advertised.partition("://")[2] or None
        ready = False
        if bootstrap:
            host, _, port = bootstrap.rpartition(":")
            probe = LocalBroker(
                self.data_dir,
                port=int(port),
                host=host,
                secure=self.secure,
                node_id=self.node_id,
                secrets_dir=self.secrets_dir,
            )
            # One look, not a loop: a longer wait than the start-up loop's, so a busy host
            # (a TLS handshake and SASL before the metadata) does not read as "not answering".
            ready = probe._accepts() and probe._metadata_ok(timeout_s=STATUS_PROBE_S)
        return BrokerStatus(True, pid, bootstrap, self.data_dir, ready)


#: How long `jobwheel broker status` waits for a node's metadata answer.
STATUS_PROBE_S = 10.0
#: A cluster's data dir holds this file: its nodes, their ports and the cluster id, written at
#: the first start and read back by every later command (stop, status, a node's restart).
CLUSTER_FILE = "cluster.json"
#: Heap of each node of a local cluster: three of them run beside the stack on 2 cores.
CLUSTER_NODE_HEAP = "384m"


@dataclass(frozen=True)
class ClusterNode:
    """One node of a local cluster as its manifest records it."""

    node_id: int
    port: int
    controller_port: int


@dataclass(frozen=True)
class ClusterStatus:
    data_dir: Path
    bootstrap: str
    nodes: dict[int, BrokerStatus]

    @property
    def running(self) -> int:
        return sum(1 for s in self.nodes.values() if s.running)

    def describe(self) -> str:
        lines = [
            f"cluster of {len(self.nodes)} nodes, {self.running} running: bootstrap "
            f"{self.bootstrap}, data dir {self.data_dir}"
        ]
        for node_id, st in sorted(self.nodes.items()):
            if not st.running:
                lines.append(f"  node {node_id}: stopped (data dir {st.data_dir})")
            else:
                state = "ready" if st.ready else "not answering"
                lines.append(f"  node {node_id}: running, {state}, {st.bootstrap}, pid {st.pid}")
        return "\n".join(lines)


def is_cluster_dir(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds a :class:`LocalCluster` (else a single broker, or nothing)."""
    return (Path(data_dir) / CLUSTER_FILE).is_file()


class LocalCluster:
    """A KRaft cluster of ``nodes`` brokers on this host, each broker and controller at once,
    from the same jars as :class:`LocalBroker`; identified by its data directory::

        cluster.json        the nodes, their ports and the cluster id (fixed at the first start)
        node1/ node2/ ...   each node's LocalBroker data dir (config, pid, logs, storage)
        admin.json, tls/    secure clusters only: the admin's client config and the CA

    ``secure=True`` makes every node what a secure single broker is (:func:`secure_overrides`:
    SASL over TLS on the client, inter-broker and controller listeners, ACLs), each with a
    certificate of its own from the cluster's one CA, all formatted with one admin credential.

    Why on one host: the faults only a cluster has (a partition leader, a transaction or group
    coordinator moving to another broker mid-transaction, writes stopping without a quorum of
    in-sync replicas) can be produced with real processes and real signals on a laptop or a CI
    machine. Node 1 takes the given ports; the others take the next free ones above them.
    Nodes can be stopped, killed and started one at a time (rolling restarts, fault tests).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        nodes: int = 3,
        port: int = 9092,
        controller_port: int = 9093,
        heap: str = CLUSTER_NODE_HEAP,
        lib_dir: Path = LIB_DIR,
        host: str = HOST,
        startup_timeout_s: float = 180.0,
        ports: Sequence[tuple[int, int]] | None = None,
        secure: bool = False,
        jvm_options: Sequence[str] = (),
    ) -> None:
        """``ports`` gives every node's ``(port, controller port)`` (tests pick free ones);
        otherwise node 1 takes ``port``/``controller_port`` and the others the next free ones.
        A cluster already recorded in ``data_dir`` keeps its own nodes and ports."""
        self.data_dir = Path(data_dir).resolve()
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self.lib_dir = lib_dir
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        # once secure, always, as a single broker: the nodes' storage holds the admin credential
        self.secure = secure or (self.data_dir / "admin.json").is_file()
        recorded = self._read_manifest()
        if recorded is not None:
            self.cluster_id, self.nodes = recorded
            if nodes != len(self.nodes):
                raise ConfigError(
                    f"the cluster in {self.data_dir} has {len(self.nodes)} nodes, not {nodes}: "
                    f"start it with --nodes {len(self.nodes)}, or use another --data-dir"
                )
        else:
            if nodes < 2:
                raise ConfigError(f"a local cluster needs 2 nodes or more, not {nodes}")
            self.cluster_id = new_cluster_id()
            self.nodes = self._pick_ports(nodes, port, controller_port, ports)
        self._brokers = {n.node_id: self._broker(n) for n in self.nodes}

    @classmethod
    def load(cls, data_dir: Path, **kwargs: Any) -> LocalCluster:
        """The cluster recorded in ``data_dir`` (see :func:`is_cluster_dir`)."""
        path = Path(data_dir) / CLUSTER_FILE
        try:
            count = len(json.loads(path.read_text())["nodes"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read the local cluster's manifest {path}: {exc}") from exc
        return cls(data_dir, nodes=count, **kwargs)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        nodes: int | None = None,
        data_dir: Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        secure: bool = False,
    ) -> LocalCluster:
        """The cluster of ``settings`` (data in ``<data_dir>/kafka``), CLI flags winning;
        ``nodes`` None: the cluster recorded there (:meth:`load`), with its own ports. Either
        way the JVMs get the settings' options, a node started again as the first start."""
        data_dir = data_dir or settings.data_dir / "kafka"
        jvm_options = settings.broker_jvm_args
        if nodes is None:
            return cls.load(data_dir, secure=secure, jvm_options=jvm_options)
        return cls(
            data_dir,
            nodes=nodes,
            port=port or settings.broker_port,
            controller_port=controller_port or settings.broker_controller_port,
            secure=secure,
            jvm_options=jvm_options,
        )

    # --- layout -----------------------------------------------------------------------------

    @property
    def manifest_path(self) -> Path:
        return self.data_dir / CLUSTER_FILE

    @property
    def bootstrap(self) -> str:
        """Every node's client listener: a client reaches the cluster while any one is up."""
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    @property
    def node_ids(self) -> list[int]:
        return [n.node_id for n in self.nodes]

    def node(self, node_id: int) -> LocalBroker:
        try:
            return self._brokers[node_id]
        except KeyError:
            raise ConfigError(
                f"the cluster in {self.data_dir} has no node {node_id}; its nodes are "
                f"{', '.join(map(str, self.node_ids))}"
            ) from None

    @property
    def admin_config_path(self) -> Path:
        """The admin's client config of a secure cluster (every node's, the same file)."""
        return self._brokers[self.node_ids[0]].admin_config_path

    @property
    def ca_cert_path(self) -> Path:
        return self._brokers[self.node_ids[0]].ca_cert_path

    def admin_config(self) -> dict[str, str]:
        """The admin's librdkafka settings (secure clusters; {} otherwise)."""
        return self._brokers[self.node_ids[0]].admin_config()

    def client_config(self) -> dict[str, str]:
        """A confluent-kafka config that reaches the cluster (as its admin, when secure)."""
        return {"bootstrap.servers": self.bootstrap, **self.admin_config()}

    def _broker(self, n: ClusterNode) -> LocalBroker:
        return LocalBroker(
            self.data_dir / f"node{n.node_id}",
            port=n.port,
            controller_port=n.controller_port,
            heap=self.heap,
            lib_dir=self.lib_dir,
            host=self.host,
            startup_timeout_s=self.startup_timeout_s,
            node_id=n.node_id,
            voters=[(m.node_id, m.controller_port) for m in self.nodes],
            cluster_id=self.cluster_id,
            secure=self.secure,
            secrets_dir=self.data_dir,
            jvm_options=self.jvm_options,
        )

    def _pick_ports(
        self,
        count: int,
        port: int,
        controller_port: int,
        ports: Sequence[tuple[int, int]] | None,
    ) -> list[ClusterNode]:
        if ports is not None:
            if len(ports) != count:
                raise ConfigError(f"{count} nodes need {count} port pairs, got {len(ports)}")
            return [ClusterNode(i + 1, p, c) for i, (p, c) in enumerate(ports)]
        taken = {port, controller_port}
        candidate = max(taken) + 1
        picked: list[int] = []
        while len(picked) < 2 * (count - 1):
            if candidate > 65_535:
                raise ConfigError(
                    f"no free ports above {max(taken)} for the other nodes: give lower "
                    "--port/--controller-port values"
                )
            if candidate not in taken and port_free(candidate, self.host):
                picked.append(candidate)
            candidate += 1
        nodes = [ClusterNode(1, port, controller_port)]
        nodes += [ClusterNode(i + 2, picked[2 * i], picked[2 * i + 1]) for i in range(count - 1)]
        return nodes

    def _read_manifest(self) -> tuple[str, list[ClusterNode]] | None:
        if not self.manifest_path.is_file():
            return None
        try:
            raw = json.loads(self.manifest_path.read_text())
            nodes = [
                ClusterNode(int(n["node_id"]), int(n["port"]), int(n["controller_port"]))
                for n in raw["nodes"]
            ]
            return str(raw["cluster_id"]), nodes
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"the local cluster's manifest {self.manifest_path} is unreadable ({exc}): "
                "remove the data dir to start a new cluster"
            ) from exc

    def _write_manifest(self) -> None:
        if self.manifest_path.is_file():
            return
        if (self.data_dir / "server.properties").is_file():
            raise ConfigError(
                f"{self.data_dir} holds a single-node broker; a cluster needs a data dir of its "
                "own (--data-dir), or stop that broker and remove the dir"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        manifest = {
            "cluster_id": self.cluster_id,
            "nodes": [
                {"node_id": n.node_id, "port": n.port, "controller_port": n.controller_port}
                for n in self.nodes
            ],
        }
        self.manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, *, wait: bool = True, die_with_parent: bool = False) -> float:
        """Start every node that is not running; with ``wait`` return once metadata lists all
        of them as live brokers. Returns the seconds it took.

        The nodes start together: none can finish starting alone, as each waits for a quorum
        of controllers to elect a leader.
        """
        began = time.monotonic()
        self._write_manifest()
        try:
            # Formatted together, in threads (each format is a JVM start of its own), but
            # started from this thread: PR_SET_PDEATHSIG (die_with_parent) fires when the
            # thread that started the JVM ends, not the process.
            idle = [b for b in self._brokers.values() if b.running_pid() is None]
            if self.secure and idle:
                # once, before the nodes are formatted at once: one admin password, one CA
                idle[0]._ensure_admin_credentials()
                ensure_ca(self.data_dir)
            with concurrent.futures.ThreadPoolExecutor(max(1, len(idle))) as pool:
                for _ in pool.map(lambda b: b.prepare(), idle):
                    pass
            for node_id in self.node_ids:
                self.start_node(node_id, wait=False, die_with_parent=die_with_parent)
            if wait:
                self.wait_ready()
        except BaseException:
            self.stop(timeout_s=10.0)
            raise
        return time.monotonic() - began

    def start_node(
        self,
        node_id: int,
        *,
        wait: bool = True,
        die_with_parent: bool = False,
        cgroup: Path | None = None,
    ) -> float:
        """Start one node (a restart after :meth:`stop_node` or a kill); with ``wait`` return
        once it serves requests again, which needs a quorum of controllers (itself included).
        ``cgroup``: see :meth:`LocalBroker.start`."""
        self._write_manifest()
        return self.node(node_id).start(wait=wait, die_with_parent=die_with_parent, cgroup=cgroup)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until metadata lists every node as a live broker, or raise with the log tail
        of the nodes that are missing."""
        timeout = timeout_s or self.startup_timeout_s
        deadline = time.monotonic() + timeout
        from jobwheel.kafka.admin import live_brokers

        wanted = set(self.node_ids)
        live: frozenset[int] = frozenset()
        while time.monotonic() < deadline:
            for broker in self._brokers.values():
                if broker._proc is not None:  # started here: its exit is an error to report
                    broker._raise_if_dead()
            live = live_brokers(self.client_config(), 2.0)
            if wanted <= live:
                return
            time.sleep(0.2)
        missing = sorted(wanted - live)
        logs = "\n".join(
            f"--- node {n}: {self.node(n).log_path}\n{tail(self.node(n).log_path, 15)}"
            for n in missing
        )
        raise BrokerStartError(
            f"the cluster at {self.bootstrap} did not list nodes {missing} as live brokers "
            f"within {timeout:.0f}s.\n{logs}"
        )

    def stop_node(self, node_id: int, timeout_s: float = 30.0) -> bool:
        """Stop one node cleanly (SIGTERM: it hands its leaderships over first), SIGKILL after
        ``timeout_s``. The last node of a cluster hangs in its controlled shutdown (no quorum
        is left to confirm it), so give that one a short timeout. False if it was not running."""
        return self.node(node_id).stop(timeout_s=timeout_s)

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> int | None:
        """Send ``sig`` to one node's JVM (a crash, or SIGSTOP/SIGCONT); returns its pid."""
        pid = self.node(node_id).running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pid

    def stop(self, timeout_s: float = 30.0) -> list[int]:
        """Stop every node: SIGTERM to all at once (one after another, the last one would wait
        for a quorum that has gone), SIGKILL to those still running after ``timeout_s``.
        Returns the ids of the nodes that were running."""
        pids = {n: b.running_pid() for n, b in self._brokers.items()}
        running = {n: pid for n, pid in pids.items() if pid is not None}
        for pid in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node_id, pid in running.items():
            broker = self._brokers[node_id]
            if not broker._wait_exit(pid, max(0.0, deadline - time.monotonic())):
                log.warning(
                    "cluster node ignored SIGTERM; killing it",
                    extra={"node": node_id, "pid": pid},
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                broker._wait_exit(pid, 10.0)
        for broker in self._brokers.values():
            broker.stop(timeout_s=1.0)  # reaps a child and removes the pid file
        if running:
            log.info(
                "cluster stopped", extra={"nodes": sorted(running), "data_dir": str(self.data_dir)}
            )
        return sorted(running)

    def status(self) -> ClusterStatus:
        return ClusterStatus(
            self.data_dir,
            self.bootstrap,
            {n: b.status() for n, b in self._brokers.items()},
        )
