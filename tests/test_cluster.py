"""Several hosts at once, for real: two nodes (sshd in containers on a Docker bridge network,
tests/cluster_nodes.py), the ssh target, the process runtime.

Side by side: provision two hosts -> one host's deploy fails: the error names it, the other
host finished -> deploy again: both serve -> teardown: nothing of ours left on either node.
"""

from __future__ import annotations

import subprocess
import sys

import cluster_nodes
import pytest

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


def test_hosts_are_deployed_side_by_side_and_a_failure_names_its_host(lab, nodes):
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

    lab.fab("teardown")
    for node in (first, second):
        left = cluster_nodes.in_node(node, f"ls {lab.root / 'deploy-remote'} 2>&1; pgrep -a tritonserver")
        assert "No such file" in left.stdout and "tritonserver" not in left.stdout, left.stdout

