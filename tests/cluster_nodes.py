"""Several real hosts on one machine, for the cluster tests: sshd in containers on a bridge network.

Each node is a container of the tests' own Docker engine (tests/docker_engine.py)
on a user-defined bridge network, so it has an address of its own and the same
ports as every other node, as separate machines would. The controller reaches
each over SSH as root with a key made for the test. Nothing large is copied: the
project's environment (the serving virtualenv, with the Python it was made from)
and the nvidia-pytriton wheel are mounted read-only at the paths they have here,
and the deploy is given `--serving-venv` and that wheel.

The node image (`debootstrap --variant=minbase`, bookworm) holds what a fresh
Debian server has plus what the process runtime reads from the system: sshd,
sudo, libpython3.11 and HAProxy (Debian's package, as the balancer role would
install it with apt: a container of this engine may have no route to a mirror).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import docker_engine
from docker_engine import PROJECT_ROOT, docker, has_image, import_debian_root

NODE_IMAGE = "triton-lab-standin/node:bookworm"
NODE_PACKAGES = (
    "python3", "openssh-server", "sudo", "libpython3.11", "ca-certificates", "libb64-0d", "haproxy",
    "procps", "iproute2",
)  # fmt: skip
NETWORK = "triton-lab-cluster"
WHEELS = PROJECT_ROOT / ".runtime" / "wheels"
TRITON_WHEEL_REQUIREMENT = "nvidia-pytriton==0.7.0"


@dataclass
class Node:
    name: str  # the container's name
    address: str  # on the bridge network: where the controller and the other nodes reach it


def _without_host_keys(root: Path) -> None:
    for key in root.glob("etc/ssh/ssh_host_*"):
        key.unlink()  # each node makes its own at start


def build_node_image() -> None:
    if not has_image(NODE_IMAGE):
        import_debian_root(NODE_IMAGE, NODE_PACKAGES, _without_host_keys)


def triton_wheel() -> Path:
    """The nvidia-pytriton wheel as a file (downloaded once), which every node installs from."""
    found = sorted(WHEELS.glob("nvidia_pytriton-0.7.0-*.whl"))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(WHEELS), TRITON_WHEEL_REQUIREMENT],
            check=True,
        )  # fmt: skip
        found = sorted(WHEELS.glob("nvidia_pytriton-0.7.0-*.whl"))
    return found[-1]


def start_nodes(count: int, public_key: Path, prefix: str = "triton-lab-node") -> list[Node]:
    """`count` nodes, each running sshd that accepts `public_key` for root; their addresses."""
    docker_engine.start()
    build_node_image()
    wheel = triton_wheel()
    if docker("network", "inspect", NETWORK, check=False, capture_output=True).returncode != 0:
        docker("network", "create", "--driver", "bridge", NETWORK, stdout=subprocess.DEVNULL)
    read_only = {sys.prefix, sys.base_prefix, str(wheel.parent)}
    nodes = []
    for index in range(1, count + 1):
        name = f"{prefix}-{index}"
        docker("rm", "--force", name, check=False, capture_output=True)
        mounts = [f"--volume={path}:{path}:ro" for path in sorted(read_only)]
        docker(
            "run", "--detach", "--name", name, "--hostname", f"node-{index}", "--network", NETWORK,
            f"--volume={public_key}:/root/.ssh/authorized_keys:ro", *mounts, NODE_IMAGE,
            "sh", "-c", "mkdir -p /run/sshd && ssh-keygen -A && exec /usr/sbin/sshd -D -e",
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        address = docker(
            "inspect", "--format", f"{{{{(index .NetworkSettings.Networks {NETWORK!r}).IPAddress}}}}".replace("'", '"'),
            name, capture_output=True,
        ).stdout.strip()  # fmt: skip
        nodes.append(Node(name=name, address=address))
    for node in nodes:
        wait_for_sshd(node)
    return nodes


def wait_for_sshd(node: Node, timeout_s: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex((node.address, 22)) == 0:
                return
        time.sleep(0.2)
    logs = docker("logs", node.name, check=False, capture_output=True)
    raise RuntimeError(f"sshd of {node.name} did not listen on {node.address}:22:\n{logs.stdout}{logs.stderr}")


def stop_nodes(nodes: list[Node]) -> None:
    for node in nodes:
        docker("rm", "--force", node.name, check=False, capture_output=True)


def docker_exec(node: Node) -> list[str]:
    """The argv prefix that runs a command in the node (for a process the test keeps running there)."""
    return ["docker", "--host", docker_engine.DOCKER_HOST, "exec", node.name]


def in_node(node: Node, command: str) -> subprocess.CompletedProcess:
    """Run a shell command in the node (not over SSH: what the test checks behind the pipeline's back)."""
    return docker("exec", node.name, "sh", "-c", command, check=False, capture_output=True)


if __name__ == "__main__":  # python tests/cluster_nodes.py: build the node image ahead of the tests
    docker_engine.start()
    build_node_image()
    print(triton_wheel())
