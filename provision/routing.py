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
import inspect
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
        declared = inspect.signature(default)

        @functools.wraps(default)
        def call(name: str, *args, **kwargs):
            module = get(name)
            implementation = getattr(module, default.__name__, None)
            try:
                declared.bind(*args, **kwargs)  # a wrong call fails here, naming the declaration
            except TypeError as error:
                raise TypeError(f"{package}.{default.__name__}{declared}: {error}") from None
            if implementation is not None:
                _check_implements(implementation, default, f"{package}.{name}.{default.__name__}")
                return implementation(*args, **kwargs)
            return default(*args, **kwargs)

        return call

    return get, routed


def _check_implements(implementation: Callable, default: Callable, where: str) -> None:
    """An axis module's function takes the declared parameters, by name and in order (it may take fewer
    at the end only where the declaration's are optional): a mismatch fails at once, naming both."""
    declared = list(inspect.signature(default).parameters.values())
    given = list(inspect.signature(implementation).parameters.values())
    names = [p.name for p in given]
    required_declared = [p.name for p in declared if p.default is inspect.Parameter.empty]
    if names != [p.name for p in declared][: len(names)] or len(names) < len(required_declared):
        raise TypeError(
            f"{where}{inspect.signature(implementation)} does not match its declaration "
            f"{default.__module__}.{default.__name__}{inspect.signature(default)}"
        )
