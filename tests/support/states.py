"""States with made-up hosts (documentation addresses), for the plans that read the state alone."""

from __future__ import annotations

from provision.config import settings as lab_settings
from provision.state import Host, State

PORTS = lab_settings()["ports"]


def hosts_state(count: int, target: str = "ssh", recorded: dict | None = None) -> State:
    hosts = [
        Host(name=f"node-{n}", address=f"203.0.113.{n}", private_address=f"10.52.0.{n}") for n in range(1, count + 1)
    ]
    state = State(target=target, hosts=hosts, runtime="process")
    state.deploy = {"cluster": recorded} if recorded else {}
    return state
