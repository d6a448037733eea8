"""Several hosts at once, for real: two nodes (sshd in containers on a Docker bridge network,
tests/support/cluster_nodes.py), the ssh target, the process runtime. Each node runs firewalld allowing
ssh only, as Chameleon's images do: the deploy opens what a cluster needs, teardown closes it.

Side by side: provision two hosts -> one host's deploy fails: the error names it, the other
host finished -> deploy again: both serve -> deploy --cluster --lb-node (the second node):
the balancer on a node of its own, the first its one backend -> bench --cluster measures the
first alone and through the balancer, none of it reaches the second -> teardown: nothing of
ours left on either node, their firewalls as they were.

A published cluster: deploy --cluster --publish -> each backend's Triton is open to the balancer's
node only, the balancer's ports to everyone -> status shows the balancer and both backends UP ->
bench --cluster writes the report's cluster section (each node alone, then through the balancer)
-> requests through the balancer (over fab tunnel) reach both nodes -> one node's Triton stopped:
status says it is DOWN, requests still succeed -> teardown: no balancer, nothing left on either
node, every opening closed.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from food11 import FOOD11_LABELS
from support import cluster_nodes
from support.serving import APIS, classify, status_once

from provision import sample_images

# One worker runs the tests of the tests' Docker engine (pytest-xdist's loadgroup).
pytestmark = [pytest.mark.docker, pytest.mark.deploy, pytest.mark.xdist_group("docker")]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    key = tmp_path_factory.mktemp("cluster-key") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    started = cluster_nodes.start_nodes(2, key.with_suffix(".pub"))
    yield key, started
    cluster_nodes.stop_nodes(started)


def rich_rule(source: str, port: int) -> str:
    """A rich rule as firewall-cmd --list-rich-rules shows it."""
    return f'rule family="ipv4" source address="{source}" port port="{port}" protocol="tcp" accept'


def assert_nothing_opened(nodes) -> None:
    for node in nodes:
        assert cluster_nodes.firewall_openings(node) == {"running": set(), "permanent": set()}, node.name


def refused_from_here(address: str, port: int) -> bool:
    """Whether this machine (the controller, no cluster node) cannot connect: firewalld rejects it."""
    try:
        socket.create_connection((address, port), timeout=5).close()
    except OSError:
        return True
    return False


def provision_args(key, nodes) -> list[str]:
    return [
        "provision", "--target", "ssh", "--host", ",".join(node.address for node in nodes), "--user", "root",
        "--key", str(key), "--python", "/usr/bin/python3", "--serving-venv", sys.prefix,
    ]  # fmt: skip


def test_hosts_are_deployed_side_by_side_and_a_failure_names_its_host_then_balanced_from_a_node_of_its_own(lab, nodes):
    key, (first, second) = nodes
    lab.extra_env["FABRIC_LAB_TRITON_WHEEL"] = str(cluster_nodes.triton_wheel())
    lab.fab(*provision_args(key, (first, second)))

    # Something else holds the second node's Triton port: its deploy stops, the first one's goes on.
    blocker = subprocess.Popen(
        [*cluster_nodes.docker_exec(second), "python3", "-m", "http.server", str(lab.ports["triton_http"]),
         "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        failed = lab.fab("deploy", check=False, timeout=1500)
    finally:  # ending `docker exec` leaves its process running in the container
        cluster_nodes.in_node(second, "pkill -f http.server")
        blocker.wait(timeout=10)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"failed on {second.address}" in failed.stderr
    assert f"{second.address} stopped there; {first.address} went through the whole playbook" in failed.stderr

    deployed = lab.fab("deploy", timeout=1500)
    assert "deploy complete" in deployed.stdout
    assert_nothing_opened((first, second))  # services on 127.0.0.1 need no opening
    for node in (first, second):  # both hosts' lines, each with its time
        assert f"  {node.address}: " in deployed.stdout and " s\n" in deployed.stdout
    status = lab.fab("status").stdout
    assert status.count("tritonserver: READY") == 2, status

    # The deployed hosts become a cluster whose balancer has the second node to itself: the first
    # node is its one backend, and the bench measures that node alone and through the balancer.
    clustered = lab.fab("deploy", "--cluster", "--lb-node", second.address, timeout=1500).stdout
    http, grpc = lab.ports["triton_http"], lab.ports["triton_grpc"]
    expected = {rich_rule(second.address, http), rich_rule(second.address, grpc)}  # from the balancer's node only
    assert cluster_nodes.firewall_openings(first) == {"running": expected, "permanent": expected}
    assert f"firewalld runs: open {http}/tcp from {second.address}; {grpc}/tcp from {second.address}" in clustered
    assert cluster_nodes.firewall_openings(second) == {"running": set(), "permanent": set()}
    status = status_once(lab, [f"  {api} backends: {first.address} UP\n" for api in APIS])  # not the second's
    assert f"balancer: haproxy on {second.address} (a node of its own: its Triton gets no requests)" in status
    bench = lab.fab("bench", "--cluster", "--quick", "--model", "food_classifier", timeout=1200)
    results = Path(bench.stdout.split("results: ")[1].split()[0])
    assert "## Cluster: 1 node behind one balancer" in (results / "report.md").read_text()
    cluster = json.loads((results / "summary.json").read_text())["cluster"]
    assert cluster["nodes"] == [first.address] and cluster["clients"] == 1
    levels = cluster["models"]["food_classifier"]["levels"]
    assert all(row["throughput"] > 0 and list(row["nodes_alone"]) == [first.address] for row in levels), levels
    assert cluster_nodes.inference_count_in(second, f"{second.address}:{http}", "food_classifier") == 0, (
        "no request reached it"
    )

    lab.fab("teardown")
    for node in (first, second):
        left = cluster_nodes.in_node(node, f"ls {lab.root / 'deploy-remote'} 2>&1; pgrep -a 'haproxy|tritonserver'")
        assert "No such file" in left.stdout and "tritonserver" not in left.stdout, left.stdout
        assert "haproxy" not in left.stdout, left.stdout
    assert_nothing_opened((first, second))


def test_a_cluster_answers_through_one_balancer_that_takes_a_node_that_is_down_out(lab, nodes):
    key, (first, second) = nodes
    lab.extra_env["FABRIC_LAB_TRITON_WHEEL"] = str(cluster_nodes.triton_wheel())
    lab.fab(*provision_args(key, (first, second)))
    deployed = lab.fab("deploy", "--cluster", "--publish", timeout=1500)
    assert "deploy opens their ports to everyone" in deployed.stdout

    # The balancer (on the first node) is open to everyone; the second node's Triton to the first only.
    http, grpc = lab.ports["triton_http"], lab.ports["triton_grpc"]
    balancer_ports = {f"{lab.ports[name]}/tcp" for name in ("balancer_http", "balancer_grpc", "balancer_stats")}
    assert cluster_nodes.firewall_openings(first) == {"running": balancer_ports, "permanent": balancer_ports}
    backend = {rich_rule(first.address, http), rich_rule(first.address, grpc)}
    assert cluster_nodes.firewall_openings(second) == {"running": backend, "permanent": backend}
    assert refused_from_here(second.address, http), "the controller is no cluster node: firewalld rejects it"
    published = f"http://{first.address}:{lab.ports['balancer_http']}/v2/health/ready"
    assert urllib.request.urlopen(published, timeout=10).status == 200, "the published balancer answers anyone"

    # gRPC's servers are checked on their HTTP port, as HTTP's are.
    status = status_once(lab, [f"  {api} backends: {first.address} UP, {second.address} UP\n" for api in APIS])
    assert f"balancer: haproxy on {first.address}" in status, status

    # Each node alone, then the cluster through the balancer, in one run.
    bench = lab.fab("bench", "--cluster", "--quick", "--model", "food_classifier", timeout=1200)
    results = Path(bench.stdout.split("results: ")[1].split()[0])
    report = (results / "report.md").read_text()
    assert "## Cluster: 2 nodes behind one balancer" in report and (results / "cluster.png").stat().st_size > 0
    cluster = json.loads((results / "summary.json").read_text())["cluster"]
    levels = cluster["models"]["food_classifier"]["levels"]
    assert [row["concurrency_per_node"] for row in levels] == [2, 4] and all(row["throughput"] > 0 for row in levels)
    assert all(row["nodes_alone"][node.address] > 0 for row in levels for node in (first, second))
    assert 0 < cluster["models"]["food_classifier"]["efficiency"]
    assert f"- food_classifier: {cluster['models']['food_classifier']['efficiency']:.2f}" in report

    # Each node's Triton listens on its cluster address (asked from the node itself: firewalld keeps this machine out).
    def served(node) -> int:
        return cluster_nodes.inference_count_in(node, f"{node.address}:{http}", "food_classifier")

    before = {node.name: served(node) for node in (first, second)}
    tunnel = lab.popen_fab("tunnel")
    try:
        output = ""
        while "balancer:" not in output:
            line = tunnel.stdout.readline()
            assert line, f"fab tunnel ended:\n{output}"
            output += line
        balancer_port = lab.ports["balancer_http"]
        assert f"balancer: http://127.0.0.1:{balancer_port}/v2/health/ready" in output
        through = triton_http.InferenceServerClient(f"127.0.0.1:{balancer_port}")
        image = sample_images.jpeg()
        for _ in range(12):  # HTTP, through the balancer
            assert classify(through, "food_classifier", [image])[0][0] in FOOD11_LABELS
        after = {node.name: served(node) for node in (first, second)}
        assert all(after[name] > before[name] for name in after), (before, after)  # both nodes served some

        # One node's Triton stops: the balancer's health check takes it out, requests still succeed.
        cluster_nodes.in_node(second, "pkill -f bin/tritonserver")
        status_once(lab, [f"  triton_http backends: {first.address} UP, {second.address} DOWN\n"])
        for _ in range(6):
            assert classify(through, "food_classifier", [image])[0][0] in FOOD11_LABELS
    finally:
        tunnel.send_signal(signal.SIGINT)
        tunnel.wait(timeout=30)

    lab.fab("teardown")
    for node in (first, second):
        left = cluster_nodes.in_node(node, f"ls {lab.root / 'deploy-remote'} 2>&1; pgrep -a 'haproxy|tritonserver'")
        assert "No such file" in left.stdout and "haproxy" not in left.stdout, left.stdout
    assert_nothing_opened((first, second))
