"""The `local` target: this machine, no SSH, no cloud (Ansible's local connection)."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from pathlib import Path

from provision.config import PROJECT_ROOT
from provision.errors import UsageError
from provision.state import Host, State
from provision.targets import choose_runtime


def provision(settings: dict, options: dict, state: State | None, save: Callable[[State], None], say) -> State:
    # The project's own environment already holds the serving requirements
    # (make installs them), so the local deployment reuses it.
    runtime = choose_runtime("local", settings, options.get("runtime") or "")
    serving_venv = options.get("serving_venv") or str(Path(sys.executable).parent.parent)
    new = State(
        target="local",
        hosts=[Host(name="local", address="127.0.0.1", user=getpass.getuser(), connection="local")],
        serving_venv=serving_venv,
        runtime=runtime,
    )
    if state is not None and (state.hosts, state.serving_venv, state.runtime) == (new.hosts, serving_venv, runtime):
        say("local target already provisioned: nothing to do")
        return state
    if state is not None and state.deploy and state.runtime != runtime:
        raise UsageError(f"deployed with the {state.runtime} runtime: run `fab teardown` first to switch to {runtime}")
    new.record(f"provisioned local target ({runtime} runtime)")
    save(new)
    say(f"local target provisioned ({runtime} runtime; serving environment: {serving_venv})")
    return new


def deploy_dir(settings: dict, state: State) -> str:
    """lab.local_deploy_dir, relative to the project."""
    path = Path(settings["local_deploy_dir"])
    return str(path if path.is_absolute() else PROJECT_ROOT / path)
