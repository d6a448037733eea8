"""Runtimes: how the serving stack runs on a host. Each operation is declared once here.

process  tritonserver, the API and Jupyter as processes from a virtualenv
         (no Docker, no GPU needed); host side: provision.host.process_runtime
docker   both in containers built from Dockerfile.triton and Dockerfile.api,
         on GPU hosts with the NVIDIA container toolkit, on hosts without GPUs
         as CPU images; host side: provision.host.container_runtime

A call names the runtime first: `runtimes.triton_endpoints(state.runtime, bind, ports)`.
The body of each function below is the default, used where the runtime's module
has no function of that name (provision/routing.py). A new runtime is a module
here and its Ansible tasks in playbooks/runtimes/<name>/ (deploy.yml, teardown.yml).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from provision import state as state_module
from provision.config import PROJECT_ROOT
from provision.errors import UsageError
from provision.host.layout import LOG_FILES, RUN_DIR, reachable_address
from provision.routing import router

RUNTIMES = ("process", "docker")


class UnknownRuntime(UsageError):
    pass


get, routed = router(__name__, RUNTIMES, UnknownRuntime, "runtime")


def tasks_folder(runtime: str) -> str:
    """The runtime's Ansible task files (deploy.yml, teardown.yml), which the playbooks include."""
    get(runtime)
    return str(PROJECT_ROOT / "playbooks" / "runtimes" / runtime)


@routed
def serving_pins(settings: dict, state: state_module.State) -> tuple[str, str] | None:
    """(constraints file, extra pip arguments) of the serving torch; None (the default): the target's,
    since the hosts' GPUs decide which torch build runs there."""
    return None


@routed
def uses_docker_engine() -> bool:
    """Whether the services run on a Docker engine (lab.docker.engine_host, else the host's own): not by default."""
    return False


@routed
def playbook_environment(settings: dict) -> dict:
    """The environment variables of the playbooks' commands on the hosts (lab_environment): none by default."""
    return {}


@routed
def stage(settings: dict, state: state_module.State, bundle: Path) -> None:
    """What deploy stages in the bundle beyond what every runtime gets: nothing by default."""


@routed
def triton_endpoints(bind_address: str, ports: dict) -> tuple[str, str | None]:
    """(Triton's HTTP address, its metrics URL or None) as perf_analyzer reaches them on the host.

    By default perf_analyzer runs on the host beside Triton, which listens on bind_address.
    """
    return f"{reachable_address(bind_address)}:{ports['triton_http']}", None


@routed
def bench_place(deployed: dict, run_id: str) -> dict:
    """Where perf_analyzer runs on a host, for playbooks/bench.yml: `exec`, the argv prefix that runs
    a command there in the bench folder; `tools`, the folder of perf_analyzer and python ("" for PATH);
    `client_scripts`, their folder; `become`, whether that needs root.

    By default on the host itself, with the serving virtualenv's tools.
    """
    return _on_the_host(deployed)


@routed
def cluster_clients_place(deployed: dict, run_id: str) -> dict:
    """Where `fab bench --cluster` runs its perf_analyzer clients on the balancer's host, shaped as
    bench_place's answer: they reach the balancer on the host's loopback and run
    `python -m provision.host.side_by_side` (the host's lib folder on their path).

    By default on the host itself, as bench_place.
    """
    return _on_the_host(deployed)


def _on_the_host(deployed: dict) -> dict:
    """perf_analyzer and python of the serving virtualenv, run on the host in the bench folder."""
    python = deployed.get("serving_python") or deployed["host_python"]
    return {
        "exec": [],
        "tools": f"{Path(python).parent}/",
        "client_scripts": f"{deployed['home']}/client_scripts",
        "become": False,
    }


@routed
def service_unit() -> str:
    """What runs each service, as `fab status` names it: a process id by default."""
    return "pid"


@routed
def host_command(deployed: dict, subcommand: str) -> str:
    """The shell command that runs the runtime's host-side helper with `subcommand` (status, stop...)."""
    raise NotImplementedError("every runtime has a host-side helper")


@routed
def logs_command(deployed: dict, service: str, lines: int) -> str:
    """The shell command that prints the last `lines` lines of a service's log: by default, its log file."""
    return f"tail -n {int(lines)} {shlex.quote(log_file(deployed, service))}"


def log_file(deployed: dict, service: str) -> str:
    return f"{deployed['home']}/{RUN_DIR}/{LOG_FILES[service]}"
