"""The `local` target: this machine, no SSH, no cloud (Ansible's local connection)."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from pathlib import Path

from provision.state import Host, State
from provision.targets import choose_runtime


def provision(settings: dict, options: dict, state: State | None, save: Callable[[State], None], say) -> State:
    # The project's own environment already holds the serving requirements
    # (make installs them), so the local deployment reuses it.
    choose_runtime("local", settings, options.get("runtime") or "")  # refuses docker, with the reason
    serving_venv = options.get("serving_venv") or str(Path(sys.executable).parent.parent)
    new = State(
        target="local",
        hosts=[Host(name="local", address="127.0.0.1", user=getpass.getuser(), connection="local")],
        serving_venv=serving_venv,
    )
    if state is not None and state.hosts == new.hosts and state.serving_venv == serving_venv:
        say("local target already provisioned: nothing to do")
        return state
    new.record("provisioned local target")
    save(new)
    say(f"local target provisioned (serving environment: {serving_venv})")
    return new


def release(state: State, settings: dict, save, say) -> None:
    """Nothing was reserved anywhere."""
