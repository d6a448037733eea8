"""fab status and fab logs: what runs where, read from the hosts themselves."""

from __future__ import annotations

import json
import shlex

from provision import hosts as host_commands
from provision import state as state_module
from provision.hosts import HostError

LOG_FILES = {"triton": "tritonserver.log", "api": "api.log", "jupyter": "jupyter.log"}


def _runtime_command(deployed: dict, subcommand: str) -> str:
    """The host-side helper of the host's runtime: provision.process_runtime or provision.container_runtime."""
    home = deployed["home"]
    pythonpath = f"PYTHONPATH={shlex.quote(home + '/lib')}"
    if deployed.get("runtime") == "docker":
        return (
            f"{pythonpath} {shlex.quote(deployed['host_python'])} -m provision.container_runtime "
            f"--home {shlex.quote(home)} {subcommand}"
        )
    return (
        f"{pythonpath} {shlex.quote(deployed['serving_python'])} "
        f"-m provision.process_runtime --config {shlex.quote(home + '/runtime.json')} {subcommand}"
    )


def host_status(state: state_module.State) -> dict:
    """{host name: status dict | {"error": ...}} for every provisioned host."""
    report = {}
    for host in state.hosts:
        deployed = state.deploy.get("hosts", {}).get(host.name)
        if not deployed:
            report[host.name] = {"deployed": False}
            continue
        try:
            result = host_commands.run(host, _runtime_command(deployed, "status"), timeout_s=60)
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
    for name, status in host_status(state).items():
        host = next(h for h in state.hosts if h.name == name)
        where = "this machine" if host.connection == "local" else f"{host.user}@{host.address}:{host.port}"
        lines.append(f"host {name} ({where})")
        if "error" in status:
            lines.append(f"  error: {status['error']}")
            continue
        if not status.get("deployed"):
            lines.append("  nothing deployed: run `fab deploy`")
            continue
        triton, api = status["triton"], status["api"]
        run = "container" if state.runtime == "docker" else "pid"  # what runs each service
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
    if service not in LOG_FILES:
        raise ValueError(f"unknown service {service!r}: choose {' or '.join(LOG_FILES)}")
    output = {}
    for host in state.hosts:
        deployed = state.deploy.get("hosts", {}).get(host.name)
        if not deployed:
            output[host.name] = "(nothing deployed)"
            continue
        if deployed.get("runtime") == "docker":  # the containers' logs, through Compose
            result = host_commands.run(host, _runtime_command(deployed, f"logs {service} --lines {int(lines)}"), 60)
            output[host.name] = result.stdout if result.returncode == 0 else f"(no logs: {result.stderr.strip()})"
            continue
        path = f"{deployed['home']}/run/{LOG_FILES[service]}"
        result = host_commands.run(host, f"tail -n {int(lines)} {shlex.quote(path)}", timeout_s=30)
        output[host.name] = result.stdout if result.returncode == 0 else f"(no log at {path})"
    return output
