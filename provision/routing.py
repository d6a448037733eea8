"""One axis of the pipeline (targets, runtimes): each operation declared once, routed by name.

An axis's `__init__.py` declares every operation as a function whose body is
the default and whose docstring is the interface's documentation, decorated
with `@routed`. A call names the axis value first (`runtimes.stage("docker",
settings, state, bundle)`) and goes to that module's function of the same name,
or to the default where the module has none. So code outside the axis never
compares names, and a new target or runtime is one new module. (The shape of
SkyPilot's sky/provision/__init__.py.)
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType


def router(package: str, names: tuple[str, ...], unknown: type[Exception], kind: str):
    """(get, routed) for the axis whose modules are `package`.<name> for each of `names`."""

    def get(name: str) -> ModuleType:
        """The module of `name`; `unknown` (naming the choices) for any other name."""
        if name not in names:
            raise unknown(f"unknown {kind} {name!r}: choose one of {', '.join(names)}")
        return importlib.import_module(f"{package}.{name}")

    def routed(default: Callable) -> Callable:
        @functools.wraps(default)
        def call(name: str, *args, **kwargs):
            implementation = getattr(get(name), default.__name__, None)
            return (implementation or default)(*args, **kwargs)

        return call

    return get, routed
