"""fab status and fab logs: what runs where, read from the hosts themselves."""

from __future__ import annotations

import json

from provision import cluster as clusters
from provision import hosts as host_commands
from provision import runtimes
from provision import state as state_module
from provision.errors import UsageError
from provision.hosts import HostError


def host_status(state: state_module.State) -> dict:
    """{host name: status dict | {"error": ...}} for every provisioned host."""
    report = {}
    for host in state.hosts:
        deployed = state.deploy.get("hosts", {}).get(host.name)
        if not deployed:
            report[host.name] = {"deployed": False}
            continue
        try:
            result = host_commands.run(host, runtimes.host_command(state.runtime, deployed, "status"), timeout_s=60)
        except HostError as error:
            report[host.name] = {"error": str(error)}
            continue
        try:
            report[host.name] = {"deployed": True, **json.loads(result.stdout.strip().splitlines()[-1])}
        except (ValueError, IndexError):
            report[host.name] = {"error": f"status failed: {(result.stdout + result.stderr).strip()[-500:]}"}
    return report


def describe(state: state_module.State) -> list[str]:
    """The lines `fab status` prints."""
    lines = [
        f"target: {state.target} (runtime: {state.runtime})",
        f"deploy: {state.deploy.get('status', 'not deployed')}",
    ]
    if state.deploy.get("smoke_weights"):
        lines.append("weights: SMOKE WEIGHTS (random values)")
    lines += clusters.balancer_status(state)
    for name, status in host_status(state).items():
        host = next(h for h in state.hosts if h.name == name)
        where = "this machine" if host_commands.is_this_machine(host) else f"{host.user}@{host.address}:{host.port}"
        lines.append(f"host {name} ({where})")
        if "error" in status:
            lines.append(f"  error: {status['error']}")
            continue
        if not status.get("deployed"):
            lines.append("  nothing deployed: run `fab deploy`")
            continue
        triton, api = status["triton"], status["api"]
        run = runtimes.service_unit(state.runtime)  # what runs each service: a pid, a container
        lines.append(
            f"  tritonserver: {'READY' if triton['ready'] else 'not ready'} "
            f"({run} {triton['pid'] or '-'}) {triton['url']}  log: {triton['log']}"
        )
        for model, model_state in sorted(triton["models"].items()):
            lines.append(f"    {model}: {model_state}")
        lines.append(
            f"  api: {'healthy' if api['healthy'] else 'DOWN'} ({run} {api['pid'] or '-'}) {api['url']}  log: {api['log']}"
        )
        jupyter = status.get("jupyter")
        if jupyter:
            lines.append(
                f"  jupyter: {'healthy' if jupyter['healthy'] else 'DOWN'} ({run} {jupyter['pid'] or '-'}) {jupyter['url']}"
            )
    return lines


def logs(state: state_module.State, service: str, lines: int = 50) -> dict[str, str]:
    """The last `lines` lines of a service's log on every host."""
    if service not in runtimes.LOG_FILES:
        raise UsageError(f"unknown service {service!r}: choose {' or '.join(runtimes.LOG_FILES)}")
    output = {}
    for host in state.hosts:
        deployed = state.deploy.get("hosts", {}).get(host.name)
        if not deployed:
            output[host.name] = "(nothing deployed)"
            continue
        command = runtimes.logs_command(state.runtime, deployed, service, lines)
        result = host_commands.run(host, command, timeout_s=60)
        output[host.name] = result.stdout if result.returncode == 0 else f"(no log: {result.stderr.strip()})"
    return output
