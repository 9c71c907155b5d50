"""jobwheel on a three-node KRaft cluster: the local cluster itself, topics sized for it, the
replication health, and faults only a cluster has (a broker killed under a stream of jobs).

All tests but the first share the session's cluster (``kafka_cluster``): starting three JVMs
is the slow part. A test may stop or kill nodes; ``on_cluster`` brings every node back, and
every partition back into its full ISR, before the next test starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from jobwheel.deploy.broker import LocalCluster, free_port
from jobwheel.errors import BrokerError, ConfigError
from jobwheel.kafka.admin import ensure_topics, live_brokers, topic_specs
from jobwheel.kafka.replication import (
    ReplicationCollector,
    check_replication,
    jobwheel_topics,
    replication_report,
)
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.models import State
from jobwheel.schemas.partitioning import partition_for
from jobwheel.settings import Settings
from jobwheel.streams.kafka import ChangelogReader
from tests.cluster_tasks import executions
from tests.conftest import settings_env
from tests.integration.scheduler_support import (
    SupervisedScheduler,
    TopicTail,
    log_events,
    now_ms,
    start_scheduler,
)
from tests.support import (
    BROKER_JVM_OPTIONS,
    Procs,
    kafka_call,
    log_tail,
    process_cmdline,
    scaled,
    start_worker,
    stop,
    wait_until,
)

JOBWHEEL = [sys.executable, "-m", "jobwheel.cli"]
PARTITIONS = 4


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env["JOBWHEEL_LOG_FORMAT"] = "text"
    env["JOBWHEEL_BROKER_JVM_OPTIONS"] = BROKER_JVM_OPTIONS
    return subprocess.run(
        [*JOBWHEEL, *args], env=env, capture_output=True, text=True, timeout=scaled(300)
    )


def _broker_config(bootstrap: str, node_id: int, names: list[str]) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.BROKER, str(node_id))
    entries = admin.describe_configs([resource])[resource].result(timeout=scaled(30))
    return {name: entries[name].value for name in names}


def _topic_config(bootstrap: str, topic: str, name: str) -> str:
    """A topic's config as the brokers see it; the broker asked may not know a topic created
    a moment ago through another one (UNKNOWN_TOPIC_OR_PART), so that is asked again."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return kafka_call(
        lambda: admin.describe_configs([resource])[resource].result(timeout=scaled(30))[name].value,
        f"reading {name} of {topic}",
    )


def test_cli_starts_a_three_node_cluster_stops_and_starts_one_node(tmp_path: Path) -> None:
    """`jobwheel broker start --nodes 3`, `status`, `stop 2`, `start 2`, `stop`; the internal
    topics of the cluster are sized for three nodes. Runs on a cluster of its own (before the
    session's, which starts with the first test that asks for it)."""
    data = tmp_path / "cluster"
    where = ["--data-dir", str(data)]
    port, cport = free_port(), free_port()
    try:
        started = _cli(
            "broker", "start", "--nodes", "3", *where, "--port", str(port),
            "--controller-port", str(cport),
        )  # fmt: skip
        assert started.returncode == 0, started.stderr + started.stdout
        cluster = LocalCluster.load(data)
        assert cluster.nodes[0].port == port and cluster.nodes[0].controller_port == cport
        assert f"cluster of 3 nodes ready at {cluster.bootstrap}" in started.stdout
        pids = {n: cluster.node(n).running_pid() for n in cluster.node_ids}
        assert None not in pids.values() and len(set(pids.values())) == 3
        assert live_brokers(cluster.client_config(), scaled(10)) == {1, 2, 3}
        # Offsets and transaction state (the scheduler's commits) survive one broker's loss.
        assert _broker_config(
            cluster.bootstrap,
            2,
            [
                "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr",
                "min.insync.replicas",
                "unclean.leader.election.enable",
            ],
        ) == {
            "offsets.topic.replication.factor": "3",
            "transaction.state.log.replication.factor": "3",
            "transaction.state.log.min.isr": "2",
            "min.insync.replicas": "2",
            "unclean.leader.election.enable": "false",
        }
        status = _cli("broker", "status", *where)
        assert status.returncode == 0, status.stdout
        assert status.stdout.count(", ready,") == 3, status.stdout

        stopped = _cli("broker", "stop", "2", *where)
        assert stopped.returncode == 0 and "node 2 stopped" in stopped.stdout, stopped.stderr
        partial = _cli("broker", "status", *where)
        assert partial.returncode == 1, partial.stdout
        assert "node 2: stopped" in partial.stdout
        assert cluster.node(1).running_pid() == pids[1]
        wait_until(lambda: live_brokers(cluster.client_config(), scaled(5)) == {1, 3}, scaled(60))

        restarted = _cli("broker", "start", "2", *where)
        assert restarted.returncode == 0, restarted.stderr + restarted.stdout
        assert live_brokers(cluster.client_config(), scaled(10)) == {1, 2, 3}
        # a node started again gets JOBWHEEL_BROKER_JVM_OPTIONS as the first start did
        for n in cluster.node_ids:
            cmdline = process_cmdline(cluster.node(n).running_pid())
            assert BROKER_JVM_OPTIONS in cmdline, (n, cmdline)

        down = _cli("broker", "stop", *where)
        assert down.returncode == 0 and "nodes: 1, 2, 3" in down.stdout, down.stdout
        assert all(cluster.node(n).running_pid() is None for n in cluster.node_ids)
        assert _cli("broker", "status", *where).returncode == 3
    finally:
        LocalCluster.load(data).stop(timeout_s=10) if (data / "cluster.json").exists() else None


# --- the session's cluster ---------------------------------------------------------------------


def _partitions_where(bootstrap: str, bad: Callable[[Any], bool]) -> list[str]:
    """Every partition of the cluster (internal topics too) whose metadata ``bad`` flags."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=scaled(10))
    return [
        f"{name}[{pid}] leader {p.leader} isr {p.isrs} of {p.replicas}"
        for name, topic in metadata.topics.items()
        for pid, p in topic.partitions.items()
        if bad(p)
    ]


def _wait_no_partition(
    cluster: LocalCluster,
    bad: Callable[[Any], bool],
    timeout_s: float,
    what: str,
    *,
    each_try: Callable[[], str] | None = None,
    interval_s: float = 0.5,
) -> None:
    """Wait until no partition is ``bad``; the failure names those still flagged then.
    ``each_try`` runs before every look (an action that should clear them); what it last
    returned is added to the failure."""
    last: list[str] = []
    said = [""]

    def none_left() -> bool:
        if each_try is not None:
            said[0] = each_try()
        last[:] = _partitions_where(cluster.bootstrap, bad)
        return not last

    try:
        wait_until(none_left, timeout_s, interval_s)
    except AssertionError:
        raise AssertionError(f"{what}: {last[:10]}{said[0]}") from None


def _not_preferred(p: Any) -> bool:
    return bool(p.replicas) and p.leader != p.replicas[0]


def _all_back(cluster: LocalCluster) -> None:
    """Every node running, listed as a live broker, and every partition in its full ISR."""
    for node_id in cluster.node_ids:
        if cluster.node(node_id).running_pid() is None:
            cluster.start_node(
                node_id, die_with_parent=not os.environ.get("JOBWHEEL_TEST_CLUSTER_DIR")
            )
    cluster.wait_ready(scaled(120))
    _wait_no_partition(
        cluster,
        lambda p: p.leader < 0 or len(p.isrs) < len(p.replicas),
        scaled(120),
        "partitions not back in full ISR",
    )
    # A fault leaves the leaderships it moved on the nodes that stayed up until the controller's
    # imbalance check (5 min): after two of three were down, one node led every partition and
    # coordinated every group. Each partition gets its preferred leader back, so each test
    # starts on a balanced cluster.
    # Asked again until every partition has it: the controller refuses a partition whose
    # preferred leader it does not yet count in the ISR, though the metadata read above
    # already did (a full run with three test processes: 60 s with 8 partitions led by
    # another node in full ISR, after the one election of its turn).
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def elect() -> str:
        # (No timeout arguments: confluent-kafka 2.16 raises SystemError on operation_timeout.)
        answers = admin.elect_leaders(ElectionType.PREFERRED, None).result(scaled(30))
        refused = [
            f"{tp.topic}[{tp.partition}]: {error}"
            for tp, error in answers.items()
            if error is not None and "ELECTION_NOT_NEEDED" not in str(error)
        ]
        return f"; the last election refused {refused[:10]}"

    _wait_no_partition(
        cluster,
        _not_preferred,
        scaled(60),
        "not led by their preferred leader",
        each_try=elect,
        interval_s=1.0,
    )


@pytest.fixture
def on_cluster(kafka_cluster: LocalCluster) -> Iterator[LocalCluster]:
    _all_back(kafka_cluster)
    yield kafka_cluster


def _settings(cluster: LocalCluster, tmp_path: Path, **overrides: Any) -> Settings:
    prefix = f"c{uuid.uuid4().hex[:10]}"
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=cluster.bootstrap,
        topic_prefix=prefix,
        data_dir=tmp_path / f"data-{prefix}",
        log_format="text",
        scheduler_app_id=f"{prefix}-scheduler",
        worker_group=f"{prefix}-workers",
        status_group=f"{prefix}-status",
        api_port=free_port(),
        **{"partitions": PARTITIONS, **overrides},
    )


def _listed(settings: Settings) -> Any:
    """The replication report once the metadata lists every partition of the topics just
    created (a broker learns of a topic a moment after the controller made it: a loaded full
    run read no partition at all)."""
    expected = sum(s.partitions for s in topic_specs(settings))
    last: list[Any] = [None]

    def listed() -> Any:
        last[0] = replication_report(settings, scaled(10))
        return not last[0].missing and len(last[0].partitions) == expected and last[0]

    try:
        return wait_until(listed, scaled(30), 0.2)
    except AssertionError:
        raise AssertionError(f"fresh topics not all in the metadata: {last[0]}") from None


def test_topics_ensure_sizes_topics_for_the_cluster(
    on_cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three replicas and min.insync.replicas 2 by default; settings override both; one
    warning when a setting asks for one replica on a cluster; a factor the cluster cannot hold
    is refused before anything is created."""
    sized = _settings(on_cluster, tmp_path)
    specs = topic_specs(sized)  # the registry: every topic and its partition count
    assert sorted(ensure_topics(sized)) == sorted(s.name for s in specs)
    report = _listed(sized)
    assert {len(p.replicas) for p in report.partitions} == {3}
    for name in jobwheel_topics(sized):
        assert _topic_config(on_cluster.bootstrap, name, "min.insync.replicas") == "2", name

    chosen = _settings(on_cluster, tmp_path, replication_factor=2, min_insync_replicas=2)
    ensure_topics(chosen)
    assert {len(p.replicas) for p in _listed(chosen).partitions} == {2}
    assert _topic_config(on_cluster.bootstrap, chosen.topics.runs, "min.insync.replicas") == "2"

    single = _settings(on_cluster, tmp_path, replication_factor=1)
    with caplog.at_level(logging.WARNING, logger="jobwheel.kafka.admin"):
        ensure_topics(single)
        ensure_topics(single)  # nothing created: nothing to warn about
    warnings = [r for r in caplog.records if "one replica on a cluster" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert set(warnings[0].topics) == set(jobwheel_topics(single))  # type: ignore[attr-defined]
    assert _topic_config(on_cluster.bootstrap, single.topics.runs, "min.insync.replicas") == "1"

    too_many = _settings(on_cluster, tmp_path, replication_factor=4)
    with pytest.raises(ConfigError, match="replication factor 4 but the cluster has 3"):
        ensure_topics(too_many)
    assert replication_report(too_many, scaled(10)).missing == tuple(jobwheel_topics(too_many))


def _gauges(collector: ReplicationCollector) -> dict[tuple[str, str], float]:
    """``(metric name, topic) -> value`` of the per-topic gauges of one scrape."""
    return {
        (family.name, sample.labels["topic"]): sample.value
        for family in collector.collect()
        for sample in family.samples
        if "partition" not in sample.labels
    }


def test_health_reports_under_replicated_and_offline_partitions(
    on_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A broker killed: the three-replica topics are under-replicated (still led), the
    one-replica topic's partitions on it are offline; the health check and the metrics say
    so, and both are fine again once the broker is back."""
    replicated = _settings(on_cluster, tmp_path)
    single = _settings(on_cluster, tmp_path, replication_factor=1)
    ensure_topics(replicated)
    ensure_topics(single)
    # What `jobwheel health` prints as its replication line (check_replication), asked
    # in-process: the command itself died by SIGSEGV (exit -11, no output) on a freshly started
    # cluster in 2 of 3 sessions, in one of its other checks or librdkafka (see the notes);
    # tests/integration/test_status_cli.py shows the line in the command's report.
    ok, detail = check_replication(replicated, scaled(10))
    assert ok and "in full ISR (replicas: 3)" in detail, detail  # the same reader, healthy
    runs = single.topics.runs
    # Topics made a moment ago may be missing from the metadata of the broker asked for a while.
    listed = wait_until(
        lambda: (r := replication_report(single, scaled(10))).partitions and not r.missing and r,
        30,
        message="the one-replica topics never showed in the cluster's metadata",
    )
    victim = Counter(p.leader for p in listed.partitions).most_common(1)[0][0]
    on_cluster.kill_node(victim)

    def fenced() -> bool:
        r = replication_report(single, scaled(10))
        return bool(r.offline) and victim not in r.brokers

    wait_until(fenced, scaled(60), 0.5, f"node {victim} was never fenced")
    under = replication_report(replicated, scaled(10))
    assert under.under_replicated and not under.offline, under.detail()
    assert all(victim not in p.isr for p in under.partitions)
    offline = replication_report(single, scaled(10))
    assert {p.partition for p in offline.offline if p.topic == runs} == {
        p.partition for p in offline.partitions if p.topic == runs and p.replicas == (victim,)
    }
    ok, detail = check_replication(replicated, scaled(10))
    assert not ok and "under-replicated" in detail and "offline" not in detail, detail

    gauges = _gauges(ReplicationCollector(replicated, every_s=0))
    assert gauges[("jobwheel_kafka_partitions_under_replicated", replicated.topics.runs)] > 0
    assert gauges[("jobwheel_kafka_partitions_offline", replicated.topics.runs)] == 0
    single_gauges = _gauges(ReplicationCollector(single, every_s=0))
    assert single_gauges[("jobwheel_kafka_partitions_offline", runs)] == len(
        [p for p in offline.offline if p.topic == runs]
    )

    _all_back(on_cluster)
    assert check_replication(replicated, scaled(10))[0]
    assert replication_report(single, scaled(10)).ok


# --- faults under a stream of jobs ---------------------------------------------------------------

ONE_OFF = 240
#: Seconds over which the first one-off jobs are due.
SPREAD_S = 40
#: One-off jobs scheduled while the broker is down (the SDK's acks=all producer in a failover).
DURING = 60
#: The worker's session on a cluster outlasts its group coordinator's move to another broker
#: (the controller fences a dead broker after 9 s; 10 to 20 s went by on the loaded 2-core
#: host). With the worker's default of 10 s the client drops its partitions as lost while it
#: is alive and runs again the finished runs it could not commit meanwhile (13 of 333 in one
#: run): on a cluster, give workers a session timeout past the coordinator's failover.
WORKER_SESSION_MS = 30_000
#: Two of three brokers down this long (the issue's fault), then one starts again.
TWO_DOWN_S = 30
#: A broker cut off from everything this long, then healed.
PARTITION_S = 30
#: cgroup v2, where a node is started to be cut off (iptables' cgroup match needs v2).
CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
#: The waits below, added up (scheduler start, the stream, the failover, the rest).
FAULT_BUDGET_S = 90 + 60 + 60 + 180 + 150


def _recurring_ids(partitions: int) -> list[str]:
    """One recurring job id per partition: every partition must fire again after the fault."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        job_id = f"every-{i}"
        found.setdefault(partition_for(job_id, partitions), job_id)
        i += 1
    return [found[p] for p in range(partitions)]


def _p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0


@pytest.mark.timeout(FAULT_BUDGET_S + 60)
def test_kill_9_the_leading_broker_mid_stream(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any
) -> None:
    """SIGKILL the broker leading most requests and runs partitions while one-off and
    recurring jobs fire, with a scheduler and a worker running: no job lost, no (run id,
    attempt) dispatched twice, no run executed twice, every recurring job fires again."""

    _kill_mid_stream(on_cluster, tmp_path, procs, figure, "leader", _leader_of_most)


def _leader_of_most(settings: Settings, scheduler_log: Path) -> tuple[int, str]:
    """The broker leading most of the requests and runs partitions."""
    t = settings.topics
    report = replication_report(settings, scaled(10), [t.requests, t.runs])
    leaders = Counter(p.leader for p in report.partitions)
    victim, led = leaders.most_common(1)[0]
    return victim, f"led {led} of {2 * PARTITIONS} requests/runs partitions"


@pytest.mark.timeout(FAULT_BUDGET_S + 3 * 240)
def test_rolling_restart_of_every_broker_mid_stream(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any
) -> None:
    """A rolling restart under a stream of jobs, as an operator upgrades a cluster: SIGTERM
    one broker (a controlled shutdown hands its leaderships over), start it again, wait until
    every partition is back in its full ISR, then the next; each broker's leaderships, group
    and transaction coordination move twice, and nothing is lost, dispatched twice or run
    twice."""
    _kill_mid_stream(
        on_cluster, tmp_path, procs, figure, "rolling restart", _leader_of_most, rolling=True
    )


@pytest.mark.timeout(FAULT_BUDGET_S + TWO_DOWN_S + 60)
def test_two_of_three_brokers_down_mid_stream(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any
) -> None:
    """SIGKILL two of the three brokers at once under a stream of jobs: with acks=all and
    min.insync.replicas=2 nothing can be written, there is no controller quorum, and requests
    time out; after 30 s one comes back, and everything resumes by itself: no job lost, nothing
    dispatched or run twice (the idempotent producers' duplicates after such an outage must be
    harmless), every recurring job fires again, with the leader of most partitions still
    down."""
    _kill_mid_stream(
        on_cluster, tmp_path, procs, figure, "two of three down", _leader_of_most, two_down=True
    )


@contextlib.contextmanager
def _isolated(ports: list[int], cgroup: Path) -> Iterator[None]:
    """Cut a node off (the recipe of the verified cluster notes): nothing reaches its ports,
    nothing leaves them, and nothing leaves its cgroup (its own connections to the other
    nodes: rules on its ports alone leave that half open). Healed on the way out."""
    tag = uuid.uuid4().hex[:8]
    chain_in, chain_out = f"JWCUT-IN-{tag}", f"JWCUT-OUT-{tag}"
    listed = ",".join(str(p) for p in ports)
    lo_tcp = ["-p", "tcp", "-m", "multiport"]
    rules = [
        ["-N", chain_in],
        ["-A", chain_in, "-i", "lo", *lo_tcp, "--dports", listed, "-j", "DROP"],
        ["-A", chain_in, "-i", "lo", *lo_tcp, "--sports", listed, "-j", "DROP"],
        ["-N", chain_out],
        [
            "-A",
            chain_out,
            "-o",
            "lo",
            "-p",
            "tcp",
            "-m",
            "cgroup",
            "--path",
            cgroup.name,
            "-j",
            "DROP",
        ],
        ["-I", "INPUT", "1", "-j", chain_in],
        ["-I", "OUTPUT", "1", "-j", chain_out],
    ]
    try:
        for rule in rules:
            subprocess.run(["iptables", *rule], check=True, capture_output=True, text=True)
        yield
    finally:
        for heal in (
            ["-D", "INPUT", "-j", chain_in],
            ["-D", "OUTPUT", "-j", chain_out],
            ["-F", chain_in],
            ["-X", chain_in],
            ["-F", chain_out],
            ["-X", chain_out],
        ):
            subprocess.run(["iptables", *heal], capture_output=True)


@pytest.mark.timeout(FAULT_BUDGET_S + PARTITION_S + 180)
def test_a_broker_cut_off_by_a_network_partition_mid_stream(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any
) -> None:
    """One broker cut off from the other two and from every client for 30 s by iptables (its
    JVM restarted in a cgroup of its own first, so its own connections can be dropped too),
    then healed: its leaderships and coordinators move to the other two, and nothing is lost,
    dispatched twice or run twice."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        pytest.skip("needs root and iptables to cut a broker off")
    if not (CGROUP_ROOT / "cgroup.procs").exists():
        pytest.skip(f"needs cgroup v2 at {CGROUP_ROOT} for iptables' cgroup match")
    victim = on_cluster.node_ids[-1]
    cgroup = CGROUP_ROOT / f"jobwheel-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    on_cluster.stop_node(victim)
    on_cluster.start_node(
        victim, die_with_parent=not os.environ.get("JOBWHEEL_TEST_CLUSTER_DIR"), cgroup=cgroup
    )
    _all_back(on_cluster)  # and every partition with its preferred leader: some on the victim

    def pick(settings: Settings, scheduler_log: Path) -> tuple[int, str]:
        t = settings.topics
        report = replication_report(settings, scaled(10), [t.requests, t.runs])
        led = sum(1 for p in report.partitions if p.leader == victim)
        return victim, f"led {led} of {2 * PARTITIONS} requests/runs partitions"

    _kill_mid_stream(on_cluster, tmp_path, procs, figure, "network partition", pick, cut_off=cgroup)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as the broker hashes a transactional id."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def transaction_coordinator(bootstrap: str, transactional_id: str) -> int:
    """The broker coordinating ``transactional_id``: the leader of its ``__transaction_state``
    partition, ``abs(hashCode) % partitions`` (Kafka's TransactionStateManager;
    confluent-kafka has no describe_transactions)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=scaled(10))
    partitions = metadata.topics["__transaction_state"].partitions
    h = java_string_hash(transactional_id)
    index = (0 if h == -(1 << 31) else abs(h)) % len(partitions)
    return int(partitions[index].leader)


def test_java_string_hash_matches_java() -> None:
    # Values from Java; "polygenelubricants".hashCode() is Integer.MIN_VALUE.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert java_string_hash("hello") == 99162322


@pytest.mark.timeout(FAULT_BUDGET_S + 60)
def test_kill_9_the_transaction_coordinator_mid_stream(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any
) -> None:
    """SIGKILL the broker coordinating the scheduler's transactions while it commits one every
    loop iteration: the open transaction is aborted or completed by the next coordinator,
    and nothing is lost, dispatched twice or run twice."""

    def coordinator(settings: Settings, scheduler_log: Path) -> tuple[int, str]:
        started = log_events(scheduler_log, "scheduler started")
        transactional_id = f"{settings.scheduler_app_id}-{started[-1]['instance']}"
        node = transaction_coordinator(settings.bootstrap_servers, transactional_id)
        return node, f"coordinator of {transactional_id}"

    _kill_mid_stream(on_cluster, tmp_path, procs, figure, "transaction coordinator", coordinator)


def group_coordinator(bootstrap: str, group_id: str) -> int:
    """The broker coordinating consumer group ``group_id``: the leader of its
    ``__consumer_offsets`` partition, ``abs(hashCode) % partitions`` (Kafka's
    GroupMetadataManager). Read from metadata, not describe_consumer_groups: librdkafka's
    coordinator admin path can abort the process while brokers restart (groupprobe.py)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=scaled(10))
    partitions = metadata.topics["__consumer_offsets"].partitions
    h = java_string_hash(group_id)
    index = (0 if h == -(1 << 31) else abs(h)) % len(partitions)
    return int(partitions[index].leader)


def _offsets_topic_created(bootstrap: str) -> None:
    """A fresh cluster creates ``__consumer_offsets`` on the first group coordinator lookup:
    a consumer in a throwaway group asks for its committed offsets until the topic is there."""

    def exists() -> bool:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        return "__consumer_offsets" in admin.list_topics(timeout=scaled(10)).topics

    if exists():
        return
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        with contextlib.suppress(KafkaException):
            consumer.committed([TopicPartition("__probe", 0)], timeout=scaled(10))
        wait_until(exists, scaled(60), 0.5, "__consumer_offsets was never created")
    finally:
        consumer.close()


def _groups_apart(cluster: LocalCluster, tmp_path: Path) -> Settings:
    """Settings whose scheduler group and worker group are coordinated by different nodes, so
    killing one group's coordinator leaves the other's in place: the test then shows what the
    loss of that one coordinator does."""
    _offsets_topic_created(cluster.bootstrap)
    for _ in range(100):
        settings = _settings(cluster, tmp_path)
        scheduler = group_coordinator(cluster.bootstrap, settings.scheduler_app_id)
        if scheduler != group_coordinator(cluster.bootstrap, settings.worker_group):
            return settings
    raise AssertionError("no topic prefix in 100 puts the two groups on different coordinators")


@pytest.mark.timeout(FAULT_BUDGET_S + 60)
@pytest.mark.parametrize("group", ["scheduler", "worker"])
def test_kill_9_the_group_coordinator_mid_stream(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any, group: str
) -> None:
    """SIGKILL the broker coordinating the scheduler's consumer group (its partitions'
    assignment, and the offsets its transactions commit through send_offsets_to_transaction)
    or the worker's (its members' sessions and commits) while jobs fire: the group moves to
    another coordinator, and nothing is lost, dispatched twice or run twice."""
    settings = _groups_apart(on_cluster, tmp_path)
    group_id = settings.scheduler_app_id if group == "scheduler" else settings.worker_group

    def coordinator(settings: Settings, scheduler_log: Path) -> tuple[int, str]:
        node = group_coordinator(settings.bootstrap_servers, group_id)
        return node, f"coordinator of group {group_id}"

    _kill_mid_stream(
        on_cluster, tmp_path, procs, figure, f"{group} group coordinator", coordinator, settings
    )


def _kill_mid_stream(
    on_cluster: LocalCluster,
    tmp_path: Path,
    procs: Procs,
    figure: Any,
    what: str,
    pick: Callable[[Settings, Path], tuple[int, str]],
    settings: Settings | None = None,
    rolling: bool = False,
    two_down: bool = False,
    cut_off: Path | None = None,
) -> None:
    """``pick`` names the victim once the stream is under way; it is killed with SIGKILL, or
    with ``rolling`` stopped with SIGTERM first of a restart of every node, one at a time, or
    with ``two_down`` killed together with a second node, which starts again after
    :data:`TWO_DOWN_S` while the victim stays down to the end, or with ``cut_off`` (the
    cgroup the victim runs in) cut off from every other process by iptables for
    :data:`PARTITION_S`, then healed."""
    settings = settings or _settings(on_cluster, tmp_path)
    ensure_topics(settings)
    env = settings_env(settings)
    counter = tmp_path / "executions.txt"
    tail = TopicTail(settings)
    victim = None
    try:
        # Supervised: a scheduler whose Kafka call hangs in the failover exits for a restart
        # (its watchdog), as it would under `jobwheel up` or Kubernetes.
        scheduler = SupervisedScheduler(procs, env, tmp_path / "s1", wait=True)
        worker_log = tmp_path / "worker.log"
        worker_env = {
            **env,
            "JOBWHEEL_KAFKA_CONFIG": json.dumps({"session.timeout.ms": WORKER_SESSION_MS}),
        }
        worker = start_worker(
            procs, worker_env, worker_log, tasks="jobwheel.consumers.demo,tests.cluster_tasks"
        )

        def spec(job_id: str, **when: Any) -> JobSpec:
            # A verdict delayed by the failover must not be taken for a lost run: the
            # visibility timeout is well past a leader's move (about 10 s).
            return JobSpec(
                job_id=job_id,
                task="cluster.record",
                args={"path": str(counter)},
                visibility_timeout=timedelta(seconds=60),
                max_attempts=5,
                **when,
            )

        first = now_ms() + 3000
        step = SPREAD_S * 1000 / ONE_OFF
        recurring = _recurring_ids(PARTITIONS)
        with JobClient(settings) as client:
            one_off = client.schedule_many(
                spec(
                    f"once-{i}",
                    at=datetime.fromtimestamp((first + int(i * step)) / 1000, UTC),
                )
                for i in range(ONE_OFF)
            )
            client.schedule_many(spec(job_id, every=timedelta(seconds=1)) for job_id in recurring)

            def succeeded() -> set[str]:
                scheduler.check()
                return {e.job_id for e in tail.events(state=State.SUCCEEDED)}

            # Mid-stream: a quarter of the one-off jobs have run, the rest are due.
            tail.wait(
                lambda: len(succeeded() & set(one_off)) >= ONE_OFF // 4,
                60,
                f"the stream did not start:\n{log_tail(worker_log)}",
            )
            victim, why = pick(settings, scheduler.log_path)

            def schedule_during(due: int) -> list[str]:
                return client.schedule_many(
                    spec(f"during-{i}", at=datetime.fromtimestamp((due + i * 100) / 1000, UTC))
                    for i in range(DURING)
                )

            if two_down or cut_off is not None:
                # No write is acknowledged while two are down (acks=all, min ISR 2), nor by a
                # leader cut off until its partitions move: the jobs due in the fault are
                # submitted before it.
                during = schedule_during(now_ms() + 2000)
            killed_at = now_ms()
            if rolling:
                on_cluster.stop_node(victim)
            elif two_down:
                other = min(n for n in on_cluster.node_ids if n != victim)
                on_cluster.kill_node(victim, signal.SIGKILL)
                on_cluster.kill_node(other, signal.SIGKILL)
                # The fault's length, not a wait for something to happen.
                time.sleep(TWO_DOWN_S)
                on_cluster.start_node(
                    other, die_with_parent=not os.environ.get("JOBWHEEL_TEST_CLUSTER_DIR")
                )
                why += f"; node {other} killed with it and started again after {TWO_DOWN_S} s"
            elif cut_off is not None:
                node = on_cluster.node(victim)
                with _isolated([node.port, node.controller_port], cut_off):
                    time.sleep(PARTITION_S)  # the fault's length
                why += f"; cut off by iptables for {PARTITION_S} s, then healed"
            else:
                on_cluster.kill_node(victim, signal.SIGKILL)
            if not two_down and cut_off is None:
                # While it is down and not yet fenced: more jobs through the SDK (acks=all).
                during = schedule_during(killed_at + 2000)

        def moved() -> bool:
            scheduler.check()
            r = replication_report(settings, scaled(10))
            return not r.offline and all(p.leader != victim for p in r.partitions)

        if rolling:
            # The victim back, then each other node in turn, each time every partition of the
            # cluster back in its full ISR before the next goes.
            _all_back(on_cluster)
            steps = [f"node {victim} {(now_ms() - killed_at) / 1000:.0f} s"]
            for node_id in [n for n in on_cluster.node_ids if n != victim]:
                began = now_ms()
                on_cluster.stop_node(node_id)
                _all_back(on_cluster)
                steps.append(f"node {node_id} {(now_ms() - began) / 1000:.0f} s")
            why += f"; stopped, started and back in full ISR: {', '.join(steps)}"
        else:
            wait_until(moved, scaled(60), 0.2, f"leaders never left node {victim}")
        moved_at = now_ms()
        everything = set(one_off) | set(during)
        tail.wait(
            lambda: succeeded() >= everything,
            180,
            f"jobs never SUCCEEDED ({len(everything - succeeded())} of {len(everything)}): "
            f"{sorted(everything - succeeded())[:8]}\nworker:\n{log_tail(worker_log, 30)}",
        )

        def fired_since(at_ms: int) -> set[str]:
            scheduler.check()
            ran = {e.run_id for e in tail.events(state=State.SUCCEEDED)}
            return {
                r.job_id
                for r in tail.all_runs()
                if r.scheduled_time_ms >= at_ms and r.run_id in ran
            }

        tail.wait(
            lambda: fired_since(moved_at) >= set(recurring),
            60,
            f"recurring jobs that never fired again: {set(recurring) - fired_since(moved_at)}",
        )
        assert worker.poll() is None, log_tail(worker_log)

        runs = tail.all_runs()
        dead = tail.events(state=State.DEAD)
        assert dead == [], dead[:3]
        duplicates = tail.duplicate_dispatches()
        ran = executions(counter)
        per_run = Counter(run_id for run_id, _, _ in ran)
        repeated = {run_id: n for run_id, n in per_run.items() if n > 1}
        by_run = {r.run_id: r for r in runs}
        executed_jobs = {by_run[run_id].job_id for run_id in per_run if run_id in by_run}
        lost = everything - executed_jobs
        late = [
            at - by_run[run_id].scheduled_time_ms
            for run_id, attempt, at in ran
            if attempt == 1
            and run_id in by_run
            and killed_at <= by_run[run_id].scheduled_time_ms <= moved_at
        ]
        back = {
            p: min(
                (
                    r.dispatched_at_ms
                    for r in runs
                    if r.partition == p and r.dispatched_at_ms >= moved_at
                ),
                default=None,
            )
            for p in range(PARTITIONS)
        }
        figure(
            f"[cluster: {'' if rolling or cut_off else 'kill -9 '}{what}] node {victim} ({why}) "
            f"{'stopped first' if rolling else 'cut off' if cut_off else 'killed'} mid-stream; "
            "scheduler restarted "
            f"after a hung call {len(scheduler.exits)} time(s); "
            f"{'every node restarted' if rolling else 'leaders moved'} "
            f"after {(moved_at - killed_at) / 1000:.1f} s; {len(everything)} one-off + "
            f"{len(recurring)} recurring jobs: lost {len(lost)}, duplicate dispatches "
            f"{len(duplicates)}, runs executed twice {len(repeated)}, executions {len(ran)}; "
            f"lateness of the {len(late)} runs due during the fault: max {max(late, default=0)} "
            f"ms, p99 {_p99(late)} ms; every partition dispatched again "
            f"{(max((b for b in back.values() if b), default=moved_at) - killed_at) / 1000:.1f}"
            " s after the kill"
        )
        assert lost == set(), sorted(lost)[:8]
        assert duplicates == {}, list(duplicates.items())[:5]
        # Which attempts ran: 1 and 2 is a copy the scheduler dispatched, 1 and 1 a worker's.
        assert repeated == {}, [
            (run_id, sorted(a for r, a, _ in ran if r == run_id)) for run_id in list(repeated)[:5]
        ]
        assert None not in back.values(), back
    finally:
        tail.close()


def _last_lines(path: Path, lines: int = 8, window: int = 16_384) -> str:
    """The end of a log that may be huge (a scheduler logging a failure on every iteration
    writes megabytes a second): read from its end only."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - window))
        return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    """The partition's leader as the cluster's metadata says (-1: none, its replicas are down)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=scaled(10))
    return int(metadata.topics[topic].partitions[partition].leader)


@pytest.mark.timeout(300)
def test_a_changelog_end_is_read_from_its_new_leader_once_the_old_one_was_killed(
    on_cluster: LocalCluster, tmp_path: Path, figure: Any
) -> None:
    """Measuring a changelog partition's end must find the partition's new leader soon after
    the old leader's broker died, not wait out the whole timeout on the dead one.

    The scheduler measures a changelog before it restores a claim, on a consumer that has no
    partition of the changelog assigned, so its metadata cache still names the killed broker
    as the leader. The ask went there and waited its full 10 s, and the scheduler's loop
    waited with it, once per claimed partition: in this file's coordinator-kill test, 10 s of
    the 25 s until every partition dispatched again was that wait, after the kill reset the
    scheduler."""
    settings = _settings(on_cluster, tmp_path)
    ensure_topics(settings)
    changelog = settings.topics.changelog(settings.scheduler_app_id)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all"})
    for i in range(5):
        producer.produce(changelog, key=f"k{i}".encode(), value=b"v", partition=0)
    assert producer.flush(scaled(30)) == 0
    reader = ChangelogReader(settings, "end-probe")

    def ends_now() -> tuple[int, int] | None:
        try:
            return reader.watermarks(0, timeout_s=scaled(10))
        except BrokerError:
            return None  # a topic this new may have no leader yet

    try:
        # It can see an answer: the end, from the leader its cache knows.
        wait_until(
            lambda: ends_now() == (0, 5),
            scaled(60),
            0.5,
            "the changelog's end was never read as 5",
        )
        victim = _leader(settings.bootstrap_servers, changelog, 0)
        on_cluster.kill_node(victim)
        wait_until(
            lambda: _leader(settings.bootstrap_servers, changelog, 0) not in (victim, -1),
            scaled(60),
            0.5,
            f"the changelog's partition 0 kept node {victim} as its leader",
        )
        timeout_s = scaled(30)
        began = time.monotonic()
        ends = reader.watermarks(0, timeout_s=timeout_s)
        took = time.monotonic() - began
        assert ends == (0, 5)
        assert took < timeout_s / 2, (
            f"measuring the changelog took {took:.1f} s of its {timeout_s:.0f} s timeout with "
            f"node {victim} killed and the partition led by another node: the ask waited on "
            "the dead leader its cache still named"
        )
        figure(
            f"[cluster: changelog end after a leader kill] node {victim} killed, the partition "
            f"led elsewhere: its end read in {took:.2f} s (timeout {timeout_s:.0f} s)"
        )
    finally:
        reader.close()


@pytest.mark.timeout(600)
def test_a_changelog_without_a_leader_at_a_claim_is_restored_once_its_broker_is_back(
    on_cluster: LocalCluster, tmp_path: Path, procs: Procs, figure: Any
) -> None:
    """A scheduler that claims a partition while its changelog has no leader must restore it
    as soon as the changelog's broker is back, not stay "restoring" for good.

    What a short restart of a single broker does to a scheduler that resets (or starts) then:
    its new changelog consumer measures the changelog while the broker answers metadata with
    no leader for it, librdkafka caches that answer, and a consumer without an assigned
    partition of the topic never asks again ("Failed to get watermark offsets: Local: Unknown
    partition" on every try, the loop turning, until the cache expires 15 minutes later). On
    one broker that window is a moment of its start-up; here it is held open for the whole
    outage: the topics have one replica (so the changelog's partition has no leader while its
    node is down) and the other nodes answer metadata meanwhile."""
    settings = _settings(on_cluster, tmp_path, partitions=1, replication_factor=1)
    ensure_topics(settings)
    env = settings_env(settings)
    changelog = settings.topics.changelog(settings.scheduler_app_id)
    tail = TopicTail(settings)
    try:
        first = start_scheduler(procs, env, tmp_path / "s1")
        later = datetime.now(UTC) + timedelta(days=1)
        with JobClient(settings) as client:
            client.schedule_many(
                JobSpec(job_id=f"later-{i}", task="demo.echo", at=later) for i in range(50)
            )
            client.schedule_many([JobSpec(job_id="before", task="demo.echo", at=datetime.now(UTC))])
        tail.wait(lambda: tail.runs_of("before"), 60, "the first scheduler never fired")
        assert stop(first) == 0, log_tail(first.log_path)
        victim = _leader(settings.bootstrap_servers, changelog, 0)
        assert victim >= 0
        on_cluster.stop_node(victim)
        wait_until(
            lambda: _leader(settings.bootstrap_servers, changelog, 0) < 0,
            60,
            0.5,
            f"the changelog kept a leader with node {victim} stopped",
        )
        # A scheduler claiming the partition now (fresh state: it restores everything).
        second = start_scheduler(procs, env, tmp_path / "s2", wait=False)
        wait_until(
            lambda: log_events(second.log_path, "cannot read the changelog's offsets yet"),
            120,
            0.5,
            f"the second scheduler never tried to measure the changelog:\n"
            f"{log_tail(second.log_path)}",
        )
        on_cluster.start_node(
            victim, die_with_parent=not os.environ.get("JOBWHEEL_TEST_CLUSTER_DIR")
        )
        wait_until(
            lambda: _leader(settings.bootstrap_servers, changelog, 0) == victim,
            60,
            0.5,
            f"node {victim} did not lead the changelog again",
        )
        back_at = now_ms()
        # A job due now: it fires once the partition is restored and processing again.
        with JobClient(settings) as client:
            client.schedule_many([JobSpec(job_id="after", task="demo.echo", at=datetime.now(UTC))])
        try:
            tail.wait(lambda: tail.runs_of("after"), 120)
        except AssertionError:
            raise AssertionError(
                f"nothing fired for {scaled(120):.0f} s after the changelog's broker came back: "
                f"the partition is still restoring; the second scheduler's log ends:\n"
                f"{_last_lines(second.log_path)}"
            ) from None
        fired_ms = tail.runs_of("after")[0].dispatched_at_ms
        replaced = log_events(
            second.log_path, "restore made no progress; replacing the changelog consumer"
        )
        figure(
            f"[cluster: changelog leaderless at a claim] node {victim} stopped, a scheduler "
            f"claimed the partition, node {victim} started again: the job due then fired "
            f"{(fired_ms - back_at) / 1000:.1f} s after the changelog had its leader back; "
            f"changelog consumers replaced: {len(replaced)}"
        )
    finally:
        tail.close()
