"""Targets: where the pipeline runs. Each operation is declared once here.

local      this machine (Ansible's local connection)
ssh        hosts the user already has
chameleon  P100 bare-metal nodes reserved on Chameleon Cloud with python-chi (a package:
           the target in chameleon/__init__.py, the python-chi adapter in chameleon/cloud.py)

A call names the target first: `targets.release(state.target, state, settings, save, say)`.
The body of each function below is the default, used where the target's module has
no function of that name (provision/routing.py). A new target is one module here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from provision import state as state_module
from provision.errors import UsageError
from provision.routing import router
from provision.runtimes import RUNTIMES
from provision.state import State

TARGETS = ("local", "ssh", "chameleon")

Save = Callable[[State], None]
Say = Callable[[str], None]


class UnknownTarget(UsageError):
    pass


get, routed = router(__name__, TARGETS, UnknownTarget, "target")


@routed
def provision(settings: dict, options: dict, state: State | None, save: Save, say: Say) -> State:
    """Reserve or record the hosts; save() the state after every step; return it."""
    raise NotImplementedError("every target provisions")


@routed
def release(state: State, settings: dict, save: Save, say: Say, options: dict | None = None) -> None:
    """Free what provision reserved and verify it is gone: nothing, by default (the hosts are the user's).

    options: teardown's flags (release_lease: a lease the user brought goes too)."""


# The flags of `fab provision` that every target reads; the others belong to targets (provision_flags).
# (wait_for_start: `fab run` always gives it; where nothing is booked ahead there is nothing to wait for.)
COMMON_PROVISION_FLAGS = ("target", "runtime", "serving_venv", "no_wait", "wait_for_start")


@routed
def provision_flags() -> tuple[str, ...]:
    """The flags of `fab provision` this target reads beyond COMMON_PROVISION_FLAGS: none, by default
    (a flag given for a target that does not read it is refused, not ignored)."""
    return ()


@routed
def booked_ahead(state: State) -> dict:
    """A reservation that has not started yet, which the hosts wait for: {"lease": "lease NAME (booked
    from ...)", "ours": whether provision made it}; {} when nothing waits (by default)."""
    return {}


@routed
def held(state: State) -> str:
    """What the state says exists (or may exist) on the cloud, in one line: what an interrupted provision prints."""
    return "nothing reserved yet"


@routed
def holds_nothing(state: State) -> bool:
    """Whether a state left by a failed provision records nothing to release (then it is forgotten)."""
    return False


@routed
def record_problems(record: dict) -> list[str]:
    """What makes the target's own record in a state file (State.chameleon) unusable: [] when it is fine."""
    return []


@routed
def recorded_resources(record: dict) -> list[str]:
    """The cloud resources a state file's record names, a line each: what to check before removing a broken one."""
    return []


# A state file's check reads each target's own record through these (provision.state cannot import us).
state_module.register_targets(TARGETS, record_problems, recorded_resources)


@routed
def default_runtime(settings: dict) -> str:
    """The runtime of a new provision without --runtime: lab.runtime, else `process`."""
    return settings.get("runtime") or "process"


@routed
def serving_pins(settings: dict, state: State) -> tuple[str, str]:
    """(constraints file, extra pip arguments) of the serving torch for this target's GPUs."""
    return settings["constraints"], settings.get("pip_extra_args", "")


@routed
def deploy_dir(settings: dict, state: State) -> str:
    """Where deploy puts everything on the hosts: lab.remote_deploy_dir by default."""
    return settings["remote_deploy_dir"]


@routed
def release_deletes_hosts() -> bool:
    """Whether release() deletes the hosts with all that is on them (then a failed clean-up of
    the hosts does not stop teardown): no, by default."""
    return False


@routed
def deadline(state: State, settings: dict) -> datetime | None:
    """When the hosts go away (a lease's end), if ever: None by default."""
    return None


@routed
def status_lines(state: State, settings: dict) -> list[str]:
    """What `fab status` prints about the target itself before the hosts: nothing by default."""
    return []


@routed
def extend(state: State, settings: dict, hours: int, save: Save, say: Say) -> None:
    """Move the end of the reservation `hours` later."""
    raise UsageError(f"only a chameleon lease can be extended (this target is {state.target})")


def choose_runtime(target: str, settings: dict, asked: str = "") -> str:
    """The serving runtime of a new provision: the flag, else the target's default.

    process: tritonserver and the API as processes from a virtualenv (no Docker, no GPU needed).
    docker:  both in containers: on GPU hosts with the NVIDIA container toolkit,
             on hosts without GPUs as CPU images (any target, `local` included).
    """
    runtime = asked or default_runtime(target, settings)
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    return runtime


# --------------------------------------------------------------------------- guards around provision


def check_can_provision(target: str, current: State | None) -> None:
    """UsageError where another target is provisioned: one state holds the hosts of one target."""
    if current is not None and current.target != target:
        raise UsageError(
            f"already provisioned on the {current.target} target: run `fab teardown` first, "
            f"then `fab provision --target {target}`"
        )


def check_nothing_provisioned(current: State | None) -> None:
    """UsageError where something is provisioned: `fab run` tears down what it ran on, so it starts from nothing."""
    if current is not None:
        raise UsageError(
            "something is already provisioned, and `fab run` tears down what it ran on: "
            "run `fab teardown` first, or `fab deploy` and `fab bench` on what is there"
        )


def check_hosts_to_deploy(state: State) -> None:
    """UsageError where the reservation is booked ahead and has not started: its hosts come once it has."""
    booked = booked_ahead(state.target, state) if not state.hosts else {}
    if booked:
        raise UsageError(f"no host yet: {booked['lease']}; deploy after its start (fab status shows the wait)")


def forget_a_state_that_holds_nothing() -> None:
    """A provision that failed before reserving anything leaves only names: forget them."""
    recorded = state_module.load()
    if recorded is not None and holds_nothing(recorded.target, recorded):
        state_module.clear()


def interrupted_provision(target: str) -> str:
    """What an interrupted provision says: what it holds, and the two ways on."""
    forget_a_state_that_holds_nothing()
    recorded = state_module.load()
    what = held(target, recorded) if recorded is not None else "nothing reserved yet"
    return (
        f"interrupted: {what}. `fab provision --target {target}` continues where it stopped, "
        "`fab teardown` releases what exists"
    )
