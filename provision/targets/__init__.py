"""Targets: where the pipeline runs. Each module has the same interface:

    provision(settings, options, state, save, say) -> State   # reserve/record hosts; save() after every step
    release(state, settings, save, say) -> None               # free what provision reserved; verify it is gone

local      this machine (Ansible's local connection)
ssh        hosts the user already has
chameleon  a P100 bare-metal node reserved on Chameleon Cloud with python-chi
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = ("local", "ssh", "chameleon")


class UnknownTarget(ValueError):
    pass


def get(name: str) -> ModuleType:
    """The module of target `name`."""
    if name not in TARGETS:
        raise UnknownTarget(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"provision.targets.{name}")
