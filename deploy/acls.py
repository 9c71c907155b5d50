"""Kafka principals and ACLs, one principal per role with only what the role needs.

Without ACLs the topics trust whoever writes: a forged run on ``runs`` executes code on a
worker, a forged SUCCEEDED on ``acks`` completes a run that never ran, a forged CANCELLED on
``status`` rewrites a job's history. With a broker that authenticates and authorizes
(``jobwheel broker start --secure``, or any SASL cluster with an authorizer), ``jobwheel acls
apply`` creates a SCRAM user per role and grants it exactly this (:func:`role_grants`):

=========  ==================================================================================
role       may
=========  ==================================================================================
submitter  write ``requests`` (the SDK, ``jobwheel submit``, services that schedule jobs); read
           ``workers`` (which tasks the live workers serve, checked before a job is sent)
scheduler  read ``requests`` and ``acks``; write ``runs`` (every queue's: ``runs.<queue>`` of
           ``JOBWHEEL_QUEUES``), ``status``, ``dead-letter``; describe
           ``workers`` (its check of the topics at start); read and write its own topics
           (``<app id>-*``: the job store's changelog); consumer group ``<app id>`` (and its
           group configs: session timing); transactional ids ``<app id>*``
worker     read ``runs`` and each queue's ``runs.<queue>`` (groups ``JOBWHEEL_WORKER_GROUP`` and
           ``JOBWHEEL_WORKER_GROUP-<queue>``); write ``acks`` and ``workers`` (its
           announcement: the tasks it serves)
sink       read ``status`` and ``acks`` (group ``JOBWHEEL_STATUS_GROUP``)
api        what submitter and sink may (``jobwheel serve`` runs the embedded sink); for the
           console and dead-letter replay also read ``dead-letter`` and describe the groups
           ``<app id>`` and ``JOBWHEEL_WORKER_GROUP`` (members, partitions, committed offsets)
=========  ==================================================================================

Each role's process gets its credentials the way every jobwheel process gets Kafka settings:
``JOBWHEEL_KAFKA_CONFIG`` (librdkafka keys), unchanged; ``apply`` writes that JSON per role.
Topics are created by an admin (``jobwheel topics ensure`` with the admin's config), so no role
may create or delete topics, and no role other than the admin may alter ACLs. Applying again
is safe: passwords given or already written are kept, and grants a principal holds beyond its
role's (an older version's, a hand-made one) are removed.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from jobwheel.errors import BrokerError, ConfigError
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

ROLES = ("submitter", "scheduler", "worker", "sink", "api")
SCRAM_ITERATIONS = 8192

READ = ("READ", "DESCRIBE")
WRITE = ("WRITE", "DESCRIBE")


@dataclass(frozen=True, order=True)
class Grant:
    """Operations allowed on resources of one kind named ``name`` (or starting with it)."""

    resource: str  # TOPIC | GROUP | TRANSACTIONAL_ID
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False


def username(settings: Settings, role: str) -> str:
    """``<topic prefix>-<role>``: deployments sharing a cluster under other prefixes get other
    principals."""
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    return f"{settings.topic_prefix}-{role}"


def role_grants(settings: Settings, role: str) -> list[Grant]:
    """What ``role`` may do, and nothing else (pure: the table of the module doc)."""
    t = settings.topics
    app = settings.scheduler_app_id

    def topic(name: str, ops: tuple[str, ...]) -> Grant:
        return Grant("TOPIC", name, ops)

    # Every declared queue's runs topic and its workers' group (JOBWHEEL_QUEUES).
    queues = settings.queue_names

    submitter = [topic(t.requests, WRITE), topic(t.workers, READ)]
    sink = [
        topic(t.status, READ),
        topic(t.acks, READ),
        Grant("GROUP", settings.status_group, READ),
    ]
    grants = {
        "submitter": submitter,
        "scheduler": [
            topic(t.requests, READ),
            topic(t.acks, READ),
            *(topic(t.runs_for(q), WRITE) for q in queues),
            topic(t.status, WRITE),
            topic(t.dead_letter, WRITE),
            # Only to see that it exists: a scheduler checks every topic at start (and would
            # try to create one it cannot see), and never reads or writes this one.
            topic(t.workers, ("DESCRIBE",)),
            Grant("TOPIC", f"{app}-", ("READ", "WRITE", "DESCRIBE"), prefixed=True),
            Grant("GROUP", app, (*READ, "ALTER_CONFIGS", "DESCRIBE_CONFIGS")),
            Grant("TRANSACTIONAL_ID", app, WRITE, prefixed=True),
        ],
        "worker": [
            *(topic(t.runs_for(q), READ) for q in queues),
            topic(t.acks, WRITE),
            topic(t.workers, WRITE),
            *(Grant("GROUP", settings.worker_group_for(q), READ) for q in queues),
        ],
        "sink": sink,
        "api": [
            *submitter,
            *sink,
            topic(t.dead_letter, READ),
            Grant("GROUP", app, ("DESCRIBE",)),
            *(Grant("GROUP", settings.worker_group_for(q), ("DESCRIBE",)) for q in queues),
        ],
    }
    username(settings, role)  # validates the role
    return sorted(grants[role])


@dataclass(frozen=True)
class Applied:
    role: str
    principal: str
    credentials_path: Path
    granted: int
    revoked: int


def apply_acls(
    settings: Settings,
    *,
    roles: Iterable[str] = ROLES,
    credentials_dir: Path,
    passwords: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> list[Applied]:
    """Create (or update) each role's SCRAM user and make its ACLs exactly its grants.

    ``settings`` must reach the cluster as an admin (``JOBWHEEL_KAFKA_CONFIG`` of the admin).
    A role's password comes from ``passwords``, else from the credentials file an earlier run
    wrote, else it is generated; each role's client config is written to
    ``credentials_dir/<role>.json`` (mode 0600), ready for ``JOBWHEEL_KAFKA_CONFIG``. A role
    reaches the cluster as the admin does (its ``security.protocol`` and ``ssl.*`` keys: on
    TLS listeners SASL_SSL and the CA to trust), so a role's file works as it is.
    """
    from jobwheel.deploy.broker import client_credentials, transport_of, write_secret_json
    from jobwheel.kafka.admin import admin_client, replace_acls, upsert_scram_user

    roles = list(roles)
    for role in roles:
        username(settings, role)
    admin = admin_client(settings, "jobwheel.deploy")
    given = dict(passwords or {})
    done: list[Applied] = []
    try:
        for role in roles:
            user = username(settings, role)
            path = credentials_dir / f"{role}.json"
            password = given.get(role) or _existing_password(path, user) or _new_password()
            upsert_scram_user(admin, user, password, SCRAM_ITERATIONS, timeout_s)
            principal = f"User:{user}"
            granted, revoked = replace_acls(
                admin, principal, role_grants(settings, role), timeout_s
            )
            config = {"bootstrap.servers": settings.bootstrap_servers}
            config |= client_credentials(user, password, transport_of(settings.kafka_config))
            write_secret_json(path, config)
            done.append(Applied(role, principal, path, granted, revoked))
            log.info(
                "kafka role applied",
                extra={"role": role, "principal": principal, "acls": granted},
            )
    except BrokerError as exc:
        raise BrokerError(
            f"applying Kafka ACLs at {settings.bootstrap_servers} failed: {exc}. "
            "JOBWHEEL_KAFKA_CONFIG must hold an admin's credentials (for `jobwheel broker start "
            "--secure`: the admin.json in its data dir), and the broker must run an authorizer",
            code=exc.code,
        ) from exc
    return done


def _existing_password(path: Path, user: str) -> str | None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if config.get("sasl.username") == user and config.get("sasl.password"):
        return str(config["sasl.password"])
    return None


def _new_password() -> str:
    return secrets.token_urlsafe(32)
