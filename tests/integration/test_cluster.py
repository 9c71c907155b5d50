"""jobwheel on a three-node KRaft cluster: the local cluster itself (`jobwheel broker start
--nodes 3` and its per-node stop and start)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from jobwheel.deploy.broker import LocalCluster, free_port
from jobwheel.kafka.admin import live_brokers
from tests.support import scaled, wait_until

JOBWHEEL = [sys.executable, "-m", "jobwheel.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env["JOBWHEEL_LOG_FORMAT"] = "text"
    return subprocess.run(
        [*JOBWHEEL, *args], env=env, capture_output=True, text=True, timeout=scaled(300)
    )


def _broker_config(bootstrap: str, node_id: int, names: list[str]) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.BROKER, str(node_id))
    entries = admin.describe_configs([resource])[resource].result(timeout=scaled(30))
    return {name: entries[name].value for name in names}


def _topic_config(bootstrap: str, topic: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(timeout=scaled(30))[name].value


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

        down = _cli("broker", "stop", *where)
        assert down.returncode == 0 and "nodes: 1, 2, 3" in down.stdout, down.stdout
        assert all(cluster.node(n).running_pid() is None for n in cluster.node_ids)
        assert _cli("broker", "status", *where).returncode == 3
    finally:
        LocalCluster.load(data).stop(timeout_s=10) if (data / "cluster.json").exists() else None
