"""Targets: where the pipeline runs. Each module has the same interface:

    provision(settings, options, state, save, say) -> State   # reserve/record hosts; save() after every step
    release(state, settings, save, say) -> None               # free what provision reserved; verify it is gone
    deadline(state, settings) -> datetime | None              # when the hosts go away (a lease's end), if ever

local      this machine (Ansible's local connection)
ssh        hosts the user already has
chameleon  a P100 bare-metal node reserved on Chameleon Cloud with python-chi
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = ("local", "ssh", "chameleon")
RUNTIMES = ("process", "docker")


class UnknownTarget(ValueError):
    pass


def get(name: str) -> ModuleType:
    """The module of target `name`."""
    if name not in TARGETS:
        raise UnknownTarget(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"provision.targets.{name}")


def choose_runtime(target: str, settings: dict, asked: str = "") -> str:
    """The serving runtime of a new provision: the flag, else the target's default.

    process: tritonserver and the API as processes from a virtualenv (no Docker, no GPU needed).
    docker:  both in containers: on GPU hosts with the NVIDIA container toolkit,
             on hosts without GPUs as CPU images (any target, `local` included).
    """
    if target == "chameleon":
        runtime = asked or (settings.get("chameleon") or {}).get("runtime") or "docker"
    else:
        runtime = asked or settings.get("runtime") or "process"
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    return runtime
