"""Several hosts at once, for real: two nodes (sshd in containers on a Docker bridge network,
tests/cluster_nodes.py), the ssh target, the process runtime.

Side by side: provision two hosts -> one host's deploy fails: the error names it, the other
host finished -> deploy again: both serve -> deploy --cluster --lb-node (the second node):
the balancer on a node of its own, the first its one backend -> bench --cluster measures the
first alone and through the balancer, none of it reaches the second -> teardown: nothing of
ours left on either node.

A cluster: deploy --cluster -> status shows the balancer and both backends UP -> bench --cluster
writes the report's cluster section (each node alone, then through the balancer) -> requests
through the balancer (over fab tunnel) reach both nodes -> one node's Triton stopped: status
says it is DOWN, requests still succeed -> teardown: no balancer, nothing left on either node.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import cluster_nodes
import pytest
import tritonclient.http as triton_http
from food11 import FOOD11_LABELS
from helpers import APIS, classify, inference_count, status_once

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
    for node in (first, second):  # both hosts' lines, each with its time
        assert f"  {node.address}: " in deployed.stdout and " s\n" in deployed.stdout
    status = lab.fab("status").stdout
    assert status.count("tritonserver: READY") == 2, status

    # The deployed hosts become a cluster whose balancer has the second node to itself: the first
    # node is its one backend, and the bench measures that node alone and through the balancer.
    lab.fab("deploy", "--cluster", "--lb-node", second.address, timeout=1500)
    status = status_once(lab, [f"  {api} backends: {first.address} UP\n" for api in APIS])  # not the second's
    assert f"balancer: haproxy on {second.address} (a node of its own: its Triton gets no requests)" in status
    bench = lab.fab("bench", "--cluster", "--quick", "--model", "food_classifier", timeout=1200)
    results = Path(bench.stdout.split("results: ")[1].split()[0])
    assert "## Cluster: 1 node behind one balancer" in (results / "report.md").read_text()
    cluster = json.loads((results / "summary.json").read_text())["cluster"]
    assert cluster["nodes"] == [first.address] and cluster["clients"] == 1
    levels = cluster["models"]["food_classifier"]["levels"]
    assert all(row["throughput"] > 0 and list(row["nodes_alone"]) == [first.address] for row in levels), levels
    assert inference_count(f"{second.address}:{lab.ports['triton_http']}", "food_classifier") == 0, (
        "no request reached it"
    )

    lab.fab("teardown")
    for node in (first, second):
        left = cluster_nodes.in_node(node, f"ls {lab.root / 'deploy-remote'} 2>&1; pgrep -a 'haproxy|tritonserver'")
        assert "No such file" in left.stdout and "tritonserver" not in left.stdout, left.stdout
        assert "haproxy" not in left.stdout, left.stdout


def test_a_cluster_answers_through_one_balancer_that_takes_a_node_that_is_down_out(lab, nodes):
    key, (first, second) = nodes
    lab.extra_env["FABRIC_LAB_TRITON_WHEEL"] = str(cluster_nodes.triton_wheel())
    lab.fab(*provision_args(key, (first, second)))
    lab.fab("deploy", "--cluster", timeout=1500)

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

    # Each node's Triton listens on its cluster address (here: where the test reaches it too).
    http = lab.ports["triton_http"]
    before = {node.name: inference_count(f"{node.address}:{http}", "food_classifier") for node in (first, second)}
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
        after = {node.name: inference_count(f"{node.address}:{http}", "food_classifier") for node in (first, second)}
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
