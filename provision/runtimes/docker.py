"""Runtime `docker`: Triton and the API in containers (Dockerfile.triton, Dockerfile.api).

On the host, provision.host.container_runtime reports the containers and prints
their logs through Compose; the images' torch is the Triton image's, whatever
the target; perf_analyzer runs in the API container against the `triton`
container, and `fab bench --cluster`'s clients in a container of the API image
on the host's network. Ansible tasks: playbooks/runtimes/docker/.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from provision import state as state_module
from provision.host.layout import LIB_DIR
from provision.runtimes import containers
from provision.runtimes.containers import BENCH_IN_CONTAINER, CLIENTS_SERVICE


def serving_pins(settings: dict, state: state_module.State) -> tuple[str, str]:
    """The Triton image's torch (Dockerfile.triton)."""
    return settings["docker"]["constraints"], f"--extra-index-url {settings['docker']['torch_index']}"


def uses_docker_engine() -> bool:
    return True


def playbook_environment(settings: dict) -> dict:
    """Which engine every docker command on the hosts talks to: lab.docker.engine_host where set."""
    engine_host = settings["docker"].get("engine_host") or ""
    return {"DOCKER_HOST": engine_host} if engine_host else {}


def stage(settings: dict, state: state_module.State, bundle: Path) -> None:
    """The images' build context; each host's compose.yaml and build arguments follow from its
    GPUs, so the role writes them after the preflight."""
    containers.stage_build_context(settings, bundle / "build")


def triton_endpoints(bind_address: str, ports: dict) -> tuple[str, str | None]:
    """Triton is the `triton` container on the API container's network; its GPU metrics are collected."""
    return f"triton:{ports['triton_http']}", f"triton:{ports['triton_metrics']}/metrics"


def bench_place(deployed: dict, run_id: str) -> dict:
    """In the API container, whose image has perf_analyzer and the client scripts; the bench folder is mounted there."""
    return _in_the_api_image([*_compose(deployed), "exec", "--no-TTY", "--workdir", _bench_folder(run_id), "api"])


def cluster_clients_place(deployed: dict, run_id: str) -> dict:
    """A container of the API image on the host's network (compose.yaml's `clients` service): the
    balancer listens on the host's loopback, which the API container's is not."""
    return _in_the_api_image(
        [*_compose(deployed), "run", "--rm", "--no-TTY", "--workdir", _bench_folder(run_id), CLIENTS_SERVICE]
    )


def _in_the_api_image(exec_prefix: list[str]) -> dict:
    """A place (provision.runtimes.bench_place) in a container of the API image: its tools on PATH, run as root."""
    return {"exec": exec_prefix, "tools": "", "client_scripts": "/app/client_scripts", "become": True}


def _compose(deployed: dict) -> list[str]:
    return ["docker", "compose", "--file", f"{deployed['home']}/compose.yaml"]


def _bench_folder(run_id: str) -> str:
    return f"{BENCH_IN_CONTAINER}/{run_id}"


def service_unit() -> str:
    return "container"


def host_command(deployed: dict, subcommand: str) -> str:
    home = deployed["home"]
    return (
        f"PYTHONPATH={shlex.quote(f'{home}/{LIB_DIR}')} {shlex.quote(deployed['host_python'])} "
        f"-m provision.host.container_runtime --home {shlex.quote(home)} {subcommand}"
    )


def logs_command(deployed: dict, service: str, lines: int) -> str:
    """The container's log, through Compose."""
    return host_command(deployed, f"logs {service} --lines {int(lines)}")
