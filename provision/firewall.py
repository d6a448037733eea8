"""What `fab deploy` opens in a host's firewalld, and what it closes again (role firewall).

Chameleon's CC images run firewalld on every bare-metal node, allowing ssh only.
Our services listen on 127.0.0.1 and are reached through SSH tunnels, so a plain
deploy needs no opening. Two deployments do:

- a cluster: each backend's Triton (HTTP, gRPC) listens on its cluster address,
  and the balancer's host must reach it. Opened by rich rules for the balancer's
  address only, nobody else's.
- `--publish`: the services listen on every address, and their ports are opened
  to everyone (the balancer's ports in a cluster, else every service's).

An opening is what firewall-cmd takes after --add-/--query-/--remove- (kind, value),
and the same in a few words for the output (label):

    {"kind": "port", "value": "8000/tcp", "label": "8000/tcp from anywhere"}
    {"kind": "rich-rule", "label": "8000/tcp from 10.52.0.12",
     "value": 'rule family="ipv4" source address="10.52.0.12" port port="8000" protocol="tcp" accept'}

The state records every opening a deploy may have made (state.deploy["firewall"],
{host: [opening, ...]}), so that the next deploy closes what it no longer needs
and teardown closes all of them. Where firewalld does not run the role changes nothing.
"""

from __future__ import annotations

import ipaddress

from provision import cluster as clusters
from provision.host.layout import reachable_address
from provision.state import State

BALANCER_PORT_PREFIX = "balancer_"  # lab.ports' names of the balancer's ports; every other port is a host's service


def port_opening(port: int) -> dict:
    """The port, open to everyone."""
    return {"kind": "port", "value": f"{int(port)}/tcp", "label": f"{int(port)}/tcp from anywhere"}


def source_opening(port: int, source: str) -> dict:
    """The port, open to one address only."""
    family = "ipv6" if ipaddress.ip_address(source).version == 6 else "ipv4"
    rule = f'rule family="{family}" source address="{source}" port port="{int(port)}" protocol="tcp" accept'
    return {"kind": "rich-rule", "value": rule, "label": f"{int(port)}/tcp from {source}"}


def is_published(bind_address: str) -> bool:
    """Whether services bound there can be reached from other machines: a wildcard or an address not the loopback's."""
    if reachable_address(bind_address) != bind_address:
        return True
    try:
        return not ipaddress.ip_address(bind_address).is_loopback
    except ValueError:  # a name
        return bind_address != "localhost"


def openings(state: State, cluster: dict, ports: dict, bind_address: str) -> dict[str, list[dict]]:
    """{host: the openings its deployment needs}, for a deploy of the state's hosts with `cluster`
    (provision.cluster.plan, {} for none) whose services listen on bind_address (lab.bind_address)."""
    needed: dict[str, list[dict]] = {host.name: [] for host in state.hosts}
    published = is_published(bind_address)
    if cluster:
        balancer_address = cluster["addresses"][cluster["balancer"]]
        for backend in clusters.balancer_backends(state, cluster, ports):
            if backend["address"] != balancer_address:  # its own host's traffic never meets the firewall
                for port in (backend["http_port"], backend["grpc_port"]):
                    needed[backend["name"]].append(source_opening(port, balancer_address))
        if published:  # the balancer listens on bind_address; the hosts' services on their cluster addresses
            balancer_ports = [p for name, p in ports.items() if name.startswith(BALANCER_PORT_PREFIX)]
            needed[cluster["balancer"]] += [port_opening(p) for p in balancer_ports]
    elif published:
        service_ports = [p for name, p in ports.items() if not name.startswith(BALANCER_PORT_PREFIX)]
        for host in state.hosts:
            needed[host.name] += [port_opening(p) for p in service_ports]
    return needed


def recorded(state: State) -> dict[str, list[dict]]:
    """{host: the openings the deploys recorded}: what may be open now."""
    return {host: list(found) for host, found in (state.deploy.get("firewall") or {}).items()}


def union(*of_hosts: dict[str, list[dict]]) -> dict[str, list[dict]]:
    merged: dict[str, list[dict]] = {}
    for each in of_hosts:
        for host, found in each.items():
            merged.setdefault(host, [])
            merged[host] += [opening for opening in found if opening not in merged[host]]
    return merged


def no_longer_needed(before: dict[str, list[dict]], needed: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """{host: openings recorded before that the new deployment does not need}: the deploy closes them."""
    return {host: [o for o in found if o not in needed.get(host, [])] for host, found in before.items()}
