"""fab deploy: stage what the hosts need, then run playbooks/deploy.yml.

The controller stages a bundle (the runtime code, the API and client scripts,
the weights, the requirements) that the roles copy to each host. In the
`process` runtime (role triton_process) the host gets a serving virtualenv and
tritonserver, the API and Jupyter run as processes. In the `docker` runtime
(roles gpu_preflight, docker, nvidia_container_toolkit, triton_docker) the
bundle also holds the images' build context and compose.yaml
(provision/runtimes/containers.py), and both run in containers. Either way the model
repository is rendered for the host's GPUs, and copies are by checksum, so a
second deploy with nothing changed changes nothing and restarts nothing.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from provision import cluster as clusters
from provision import config, firewall, path_settings, runtimes, targets
from provision import state as state_module
from provision.ansible import PlaybookResult, run_playbook
from provision.host.layout import LIB_DIR
from provision.model_repo import check_tuned, model_names
from provision.smoke_weights import is_smoke, weight_sources

PACKAGE_DIR = Path(__file__).resolve().parent
BLIP_ON_HOST = "weights/blip"


def bundle_dir() -> Path:
    return state_module.state_file().parent / "bundle"


def _replace_tree(source: Path, destination: Path, ignore=None) -> None:
    shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(source, destination, ignore=ignore)


def serving_pins(settings: dict, state: state_module.State) -> tuple[str, str]:
    """(constraints file, extra pip arguments) of the serving torch: the runtime's, else the target's."""
    return runtimes.serving_pins(state.runtime, settings, state) or targets.serving_pins(state.target, settings, state)


def stage_bundle(settings: dict, state: state_module.State) -> dict:
    """Write the bundle; return facts the playbook needs (smoke flag, BLIP source as the host sees it)."""
    bundle = bundle_dir()
    bundle.mkdir(parents=True, exist_ok=True)

    # The host's copy of this package: its __init__.py and host/, the code that runs there.
    lib = bundle / LIB_DIR / "provision"
    _replace_tree(PACKAGE_DIR / "host", lib / "host", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(PACKAGE_DIR / "__init__.py", lib / "__init__.py")

    _replace_tree(
        config.PROJECT_ROOT / "client_scripts",
        bundle / "client_scripts",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"),
    )

    requirements = bundle / "requirements"
    requirements.mkdir(exist_ok=True)
    shutil.copy2(config.SERVING_REQUIREMENTS, requirements / "serving.txt")
    shutil.copy2(config.PROJECT_ROOT / "client_scripts" / "requirements.txt", requirements / "api.txt")
    shutil.copy2(config.PROJECT_ROOT / serving_pins(settings, state)[0], requirements / "constraints.txt")
    (requirements / "all.txt").write_text("-r serving.txt\n-r api.txt\n")

    food11, blip = weight_sources(settings)
    weights = bundle / "weights"
    weights.mkdir(exist_ok=True)
    shutil.copy2(food11, weights / "food11.pth")
    if Path(blip).is_dir():  # a local folder travels with the bundle; a hub id is passed as is
        _replace_tree(Path(blip), weights / "blip")
        blip_on_host = BLIP_ON_HOST
    else:
        shutil.rmtree(weights / "blip", ignore_errors=True)
        blip_on_host = blip
    staged = {"smoke_weights": is_smoke(food11) or is_smoke(blip), "blip_on_host": blip_on_host}
    runtimes.stage(state.runtime, settings, state, bundle)
    return staged


def deploy_dir(settings: dict, state: state_module.State) -> str:
    return targets.deploy_dir(state.target, settings, state)


def extravars(settings: dict, state: state_module.State, cluster: dict | None = None) -> dict:
    """Everything the playbooks need, from the settings and the state (never a secret).

    cluster: the cluster being deployed (provision.cluster.plan), else the recorded one.
    """
    home = deploy_dir(settings, state)
    cluster = clusters.of(state) if cluster is None else cluster
    bind_addresses = clusters.bind_addresses(settings["bind_address"], state, cluster)
    # Where firewalld runs: what this deployment needs open, and what an earlier one opened that it does not.
    needed = firewall.openings(state, cluster, settings["ports"], settings["bind_address"])
    return {
        "lab_runtime_tasks": runtimes.tasks_folder(state.runtime),  # the runtime's task files, included by the plays
        "lab_deploy_dir": home,
        "lab_serving_venv": state.serving_venv or "",
        "lab_project_dir": str(config.PROJECT_ROOT),
        "lab_controller_python": sys.executable,
        "lab_bundle_dir": str(bundle_dir()),
        "lab_bind_address": settings["bind_address"],  # the balancer's, in a cluster
        # Each host's: where its services listen, and where they answer on the host itself
        # (the deploy's checks, the model control).
        "lab_bind_addresses": bind_addresses,
        "lab_reachable_addresses": clusters.reachable(bind_addresses),
        "lab_cluster": cluster,
        "lab_balancer_backends": clusters.balancer_backends(state, cluster, settings["ports"]),
        "lab_ports": dict(settings["ports"]),
        "lab_models": model_names(),
        "lab_ready_timeout_s": int(settings["triton_ready_timeout_s"]),
        "lab_triton_wheel": settings["triton_wheel"],
        "lab_model_settings": dict(settings["models"]),
        "lab_pip_extra_args": serving_pins(settings, state)[1],
        "lab_docker": dict(settings["docker"]),
        "lab_environment": runtimes.playbook_environment(state.runtime, settings),
        "lab_firewall_open": needed,
        "lab_firewall_close": firewall.no_longer_needed(firewall.recorded(state), needed),
    }


def forks_for(settings: dict, state: state_module.State) -> int:
    """How many hosts the deploy configures at once: lab.ansible_forks, or all of them (0)."""
    return int(settings.get("ansible_forks") or 0) or max(len(state.hosts), 1)


def deploy(
    settings: dict,
    state: state_module.State,
    say: Callable[[str], None] = print,
    check: bool = False,
    cluster: bool = False,
    balancer: str = "",
) -> PlaybookResult:
    """Run the deploy playbook; record progress in the state before and after.

    check: Ansible's check mode: report what would change, change nothing (the state included).
    cluster: the hosts behind one load balancer, on the host `balancer` (name or index) or the first;
    a deployed cluster stays one.
    """
    check_tuned(settings)  # a wrong lab.models.tuned stops here, before any host is touched
    path_settings.check_deploy(settings, serving_pins(settings, state)[0])  # so does a weights file not there
    plan = clusters.plan(state, balancer) if cluster or balancer or clusters.of(state) else {}
    staged = stage_bundle(settings, state)
    variables = extravars(settings, state, plan) | {
        "lab_smoke_weights": staged["smoke_weights"],
        "lab_blip_source_on_host": staged["blip_on_host"],
    }
    forks = forks_for(settings, state)
    if check:
        return run_playbook("deploy.yml", variables, say, check=True, forks=forks)
    # Written first: a deploy interrupted half-way still leaves a state that
    # teardown knows how to clean up, and `fab deploy` again simply continues.
    # With where the services listen and the cluster: teardown verifies those addresses and stops a balancer.
    state.deploy = {
        "status": "in-progress",
        "home": variables["lab_deploy_dir"],
        "hosts": state.deploy.get("hosts", {}),
        "bind_address": variables["lab_bind_address"],
        "bind_addresses": variables["lab_bind_addresses"],
        "cluster": plan,
        # What may be open once it runs: teardown closes all of it.
        "firewall": firewall.union(firewall.recorded(state), variables["lab_firewall_open"]),
    }
    state_module.save(state)
    result = run_playbook("deploy.yml", variables, say, forks=forks)
    hosts = {host: reports.get("deployment", {}) for host, reports in result.reports.items()}
    state.deploy = {
        "status": "deployed",
        "home": variables["lab_deploy_dir"],
        "hosts": hosts,
        "ports": variables["lab_ports"],
        "bind_address": variables["lab_bind_address"],
        "bind_addresses": variables["lab_bind_addresses"],
        "cluster": plan,
        "firewall": variables["lab_firewall_open"],
        "smoke_weights": staged["smoke_weights"],
    }
    state.record(f"deployed ({result.total_changed} changes)")
    state_module.save(state)
    return result
