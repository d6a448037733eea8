"""Several real hosts on one machine, for the cluster tests: sshd in containers on a bridge network.

Each node is a container of the tests' own Docker engine (provision/docker_engine.py)
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

Each node runs firewalld as Chameleon's CC images do: its default zone allows
ssh (and dhcpv6-client) only, so a node's services are unreachable from the
other nodes until the deploy opens them (role firewall). firewalld talks over
the system D-Bus and filters the container's own network namespace with
nftables (the container gets CAP_NET_ADMIN for it).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from provision import docker_engine
from provision.docker_engine import PROJECT_ROOT, docker, has_image, import_debian_root

NODE_IMAGE = "triton-lab-standin/node:bookworm-firewalld"
NODE_PACKAGES = (
    "python3", "openssh-server", "sudo", "libpython3.11", "ca-certificates", "libb64-0d", "haproxy",
    "procps", "iproute2", "firewalld", "dbus", "netbase",  # netbase: /etc/protocols, which firewalld reads
    "libpam-systemd",  # firewalld -> polkitd -> a logind; debootstrap resolves no alternatives itself
)  # fmt: skip
# The node's start: D-Bus, firewalld (ready when firewall-cmd says so), then sshd in the foreground.
NODE_START = """
mkdir -p /run/sshd /run/dbus && ssh-keygen -A && dbus-daemon --system --fork && firewalld
for _ in $(seq 150); do firewall-cmd --state >/dev/null 2>&1 && break; sleep 0.2; done
firewall-cmd --state || { echo "firewalld did not start" >&2; exit 1; }
exec /usr/sbin/sshd -D -e
"""
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
            "--cap-add=NET_ADMIN", "--cap-add=NET_RAW",
            f"--volume={public_key}:/root/.ssh/authorized_keys:ro", *mounts, NODE_IMAGE, "sh", "-c", NODE_START,
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


def wait_for_sshd(node: Node, timeout_s: float = 60) -> None:
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


def firewall_openings(node: Node) -> dict[str, set[str]]:
    """What the node's firewalld opens beyond its defaults, in its running and its permanent
    configuration: {"running": {"9000/tcp", 'rule family="ipv4" source address=... accept', ...}, "permanent": ...}."""
    found = {}
    for configuration, option in (("running", ""), ("permanent", "--permanent")):
        listed = in_node(node, f"firewall-cmd {option} --list-ports && firewall-cmd {option} --list-rich-rules")
        assert listed.returncode == 0, listed.stderr
        ports, *rules = listed.stdout.splitlines() or [""]
        found[configuration] = set(ports.split()) | {rule for rule in rules if rule.strip()}
    return found


def inference_count_in(node: Node, address: str, model: str) -> int:
    """How many inferences of `model` the Triton at address (host:port) has served, asked from inside
    the node (the controller is no cluster node: firewalld keeps it out)."""
    script = (
        "import json, urllib.request; "
        f"stats = json.load(urllib.request.urlopen('http://{address}/v2/models/{model}/stats')); "
        "print(stats['model_stats'][0]['inference_count'])"
    )
    asked = in_node(node, f"python3 -c {shlex.quote(script)}")
    assert asked.returncode == 0, asked.stderr
    return int(asked.stdout.strip())


if __name__ == "__main__":  # python tests/support/cluster_nodes.py: build the node image ahead of the tests
    docker_engine.start()
    build_node_image()
    print(triton_wheel())
