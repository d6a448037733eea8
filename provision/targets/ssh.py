"""The `ssh` target: hosts the user already has (a lab GPU box, a manually created instance)."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable

from provision.errors import UsageError
from provision.hosts import check_reachable
from provision.state import Host, State
from provision.targets import choose_runtime


def provision_flags() -> tuple[str, ...]:
    return ("host", "user", "port", "key", "python")


def _hosts(options: dict) -> list[Host]:
    addresses = [a for item in options.get("hosts") or [] for a in str(item).split(",") if a.strip()]
    if not addresses:
        raise UsageError("the ssh target needs at least one host: fab provision --target ssh --host HOST")
    user = options.get("user") or getpass.getuser()
    port = int(options.get("port") or 22)
    key = os.path.abspath(os.path.expanduser(options["key"])) if options.get("key") else None
    if key and not os.path.exists(key):
        raise UsageError(f"the key file {key} does not exist: check --key")
    hosts = []
    for address in addresses:
        address = address.strip()
        name = address if addresses.count(address) == 1 else f"{address}_{port}"
        hosts.append(Host(name=name, address=address, port=port, user=user, key=key, python=options.get("python")))
    return hosts


def provision(settings: dict, options: dict, state: State | None, save: Callable[[State], None], say) -> State:
    hosts = _hosts(options)
    serving_venv = options.get("serving_venv") or None
    runtime = choose_runtime("ssh", settings, options.get("runtime") or "")
    if state is not None and (state.hosts, state.serving_venv, state.runtime) == (hosts, serving_venv, runtime):
        say("these ssh hosts are already provisioned: nothing to do")
        return state
    for host in hosts:
        version = check_reachable(host)
        say(f"{host.user}@{host.address}:{host.port} reachable ({version})")
    if state is not None and state.deploy and state.runtime != runtime:
        raise UsageError(f"deployed with the {state.runtime} runtime: run `fab teardown` first to switch to {runtime}")
    new = State(target="ssh", hosts=hosts, serving_venv=serving_venv, runtime=runtime)
    new.record(f"provisioned ssh hosts {', '.join(h.address for h in hosts)} ({runtime} runtime)")
    save(new)
    return new

