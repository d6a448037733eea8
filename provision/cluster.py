"""A cluster: the provisioned hosts' Tritons behind one load balancer (HAProxy, role load_balancer).

`fab deploy --cluster [--lb-node NODE]` makes one: each host's services listen on
its cluster address (the address the other hosts reach it at: Host.private_address,
Chameleon's fixed IP on the shared network, else the address we reach it at), so
that the balancer reaches every Triton; the balancer itself listens on 127.0.0.1
of its host like every other service (`fab tunnel` forwards it). It runs on the
first host, which also serves, or on NODE, a node of its own: the balancer and
`fab bench --cluster`'s clients have it to themselves, and its Triton (deployed
like every host's: the clients' perf_analyzer is the serving stack's) gets no
requests. The state records it in state.deploy["cluster"]:

    {"balancer": "node-3", "own_node": true,
     "addresses": {"node-1": "10.52.0.11", "node-2": "10.52.0.12", "node-3": "10.52.0.13"}}

and a later `fab deploy` keeps it; `fab teardown` removes it with the rest.
"""

from __future__ import annotations

import json
import shlex

from provision import hosts as host_commands
from provision.errors import UsageError
from provision.host.layout import LIB_DIR, reachable_address
from provision.hosts import select
from provision.state import Host, State


class ClusterError(UsageError):
    pass


def cluster_address(host: Host) -> str:
    """Where the other hosts reach this one's services."""
    if host_commands.is_this_machine(host):
        raise ClusterError(f"a cluster needs hosts of their own: {host_commands.THIS_MACHINE}, one host")
    return host.private_address or host.address


def plan(state: State, balancer: str = "") -> dict:
    """The cluster of the state's hosts, its balancer on `balancer` (a host's name or index: a node of
    its own), else where the deployed cluster has it, else on the first host (which also serves)."""
    recorded = state.deploy.get("cluster") or {}
    try:
        chosen = select(state.hosts, balancer) if balancer else None
    except ValueError as error:  # no such host: the message names the hosts there are
        raise ClusterError(f"--lb-node: {error}") from None
    if chosen is not None:
        name, own_node = chosen.name, True
    else:
        name, own_node = recorded.get("balancer") or state.hosts[0].name, bool(recorded.get("own_node"))
    if own_node and len(state.hosts) < 2:
        raise ClusterError(
            f"--lb-node {name}: a node of its own for the balancer leaves no host to serve; provision one more "
            "(`fab provision --count 2`, or a second --host), or leave out --lb-node to balance on the serving host"
        )
    return {
        "balancer": name,
        "own_node": own_node,
        "addresses": {host.name: cluster_address(host) for host in state.hosts},
    }


def backends(state: State, cluster: dict) -> list[Host]:
    """The hosts whose Triton the balancer sends requests to: every host but a balancer's own node."""
    if not cluster:
        return []
    return [host for host in state.hosts if not (cluster.get("own_node") and host.name == cluster["balancer"])]


def of(state: State) -> dict:
    """The deployed cluster ({} when the hosts are deployed each on its own)."""
    return state.deploy.get("cluster") or {}


def balancer_address(state: State) -> str:
    """Where the balancer answers on its host: lab.bind_address (127.0.0.1), a wildcard on the loopback."""
    return reachable_address(state.deploy.get("bind_address") or "127.0.0.1")


def balancer_status(state: State) -> list[str]:
    """`fab status`'s lines on the balancer: where it listens, which backends it counts as healthy."""
    host = balancer_host(state)
    if host is None:
        return []
    ports, home = state.deploy["ports"], state.deploy["hosts"].get(host.name, {}).get("home", "")
    address = balancer_address(state)
    stats = f"http://{address}:{ports['balancer_stats']}/stats"
    command = f"PYTHONPATH={shlex.quote(f'{home}/{LIB_DIR}')} python3 -m provision.host.balancer status --stats-url {stats}"
    own_node = " (a node of its own: its Triton gets no requests)" if of(state).get("own_node") else ""
    lines = [
        f"balancer: haproxy on {host.name}{own_node}, http://{address}:{ports['balancer_http']} "
        f"(gRPC :{ports['balancer_grpc']}, statistics {stats})"
    ]
    try:
        result = host_commands.run(host, command, timeout_s=30)
    except host_commands.HostError as error:
        return [*lines, f"  cannot ask it: {error}"]
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [*lines, f"  cannot read its statistics: {(result.stdout + result.stderr).strip()[-300:]}"]
    if not report["running"]:
        return [*lines, "  NOT RUNNING: `fab deploy` starts it again"]
    for backend, servers in sorted(report["backends"].items()):
        lines.append(f"  {backend} backends: " + ", ".join(f"{name} {health}" for name, health in servers.items()))
    return lines


def balancer_host(state: State) -> Host | None:
    cluster = of(state)
    return next((h for h in state.hosts if h.name == cluster.get("balancer")), None) if cluster else None


def bind_addresses(bind_address: str, state: State, cluster: dict) -> dict[str, str]:
    """{host: where its services listen}: its cluster address in a cluster, else lab.bind_address."""
    return {host.name: cluster["addresses"][host.name] if cluster else bind_address for host in state.hosts}


def reachable(bind_addresses: dict[str, str]) -> dict[str, str]:
    """{host: where its services answer on the host itself}: a wildcard bind on the loopback."""
    return {name: reachable_address(address) for name, address in bind_addresses.items()}


def deployed_bind_addresses(state: State) -> dict[str, str]:
    """{host: where its services listen}, as the last deploy recorded it."""
    recorded = state.deploy.get("bind_addresses") or {}
    default = state.deploy.get("bind_address") or "127.0.0.1"
    return {host.name: recorded.get(host.name, default) for host in state.hosts}


def balancer_backends(state: State, cluster: dict, ports: dict) -> list[dict]:
    """The load_balancer role's backends: each backend host's Triton at its cluster address (none without a cluster)."""
    return [
        {
            "name": host.name,
            "address": cluster["addresses"][host.name],
            "http_port": ports["triton_http"],
            "grpc_port": ports["triton_grpc"],
        }
        for host in backends(state, cluster)
    ]
