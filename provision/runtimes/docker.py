"""Runtime `docker`: Triton and the API in containers (Dockerfile.triton, Dockerfile.api).

On the host, provision.host.container_runtime reports the containers and prints
their logs through Compose; the images' torch is the Triton image's, whatever
the target; perf_analyzer runs in the API container against the `triton`
container. Ansible tasks: playbooks/runtimes/docker/.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from provision import state as state_module
from provision.host.layout import LIB_DIR
from provision.runtimes import containers


def serving_pins(settings: dict, state: state_module.State) -> tuple[str, str]:
    """The Triton image's torch (Dockerfile.triton)."""
    return settings["docker"]["constraints"], f"--extra-index-url {settings['docker']['torch_index']}"


def stage(settings: dict, state: state_module.State, bundle: Path) -> None:
    """The images' build context; each host's compose.yaml and build arguments follow from its
    GPUs, so the role writes them after the preflight."""
    containers.stage_build_context(settings, bundle / "build")


def cluster_bench_refusal() -> str:
    # perf_analyzer runs inside the API container, whose loopback is not the host's, where the
    # balancer listens; the host itself has no perf_analyzer.
    return (
        "fab bench --cluster runs its clients on the balancer's host, which the docker runtime gives no "
        "perf_analyzer: on this runtime, measure the nodes with `fab bench` and the balancer with your own client "
        "through `fab tunnel`"
    )


def triton_endpoints(bind_address: str, ports: dict) -> tuple[str, str | None]:
    """Triton is the `triton` container on the API container's network; its GPU metrics are collected."""
    return f"triton:{ports['triton_http']}", f"triton:{ports['triton_metrics']}/metrics"


def bench_place(deployed: dict, run_id: str) -> dict:
    """In the API container, whose image has perf_analyzer and the client scripts; the bench folder is mounted there."""
    return {
        "exec": ["docker", "compose", "--file", f"{deployed['home']}/compose.yaml", "exec", "--no-TTY",
                 "--workdir", f"/app/bench/{run_id}", "api"],
        "tools": "",
        "client_scripts": "/app/client_scripts",
        "become": True,
    }  # fmt: skip


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
