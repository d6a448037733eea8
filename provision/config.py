"""The `lab` settings: fabric.yaml, under what the user overrides. The one reader of them.

fabric.yaml is the project's file, which Fabric reads for tasks.py: the tasks
pass what Invoke merged (fabric.yaml, FABRIC_LAB_* variables, `fab -f FILE`)
to settings(); code that runs outside Fabric (the benchmarks, `python -m
provision.local_serving`, the tests) calls settings() with its own overrides
or none. Either way the result is fabric.yaml's `lab:` section with the
overrides merged in, key by key, as plain dicts and lists.
"""

from __future__ import annotations

import copy
import importlib.util
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
SERVING_REQUIREMENTS = MODEL_REPOSITORY / "requirements.txt"
CLIENT_SCRIPTS = PROJECT_ROOT / "client_scripts"


@cache
def client_script(name: str) -> ModuleType:
    """client_scripts/<name>.py as a module: code the hosts, the API container and the notebook run
    (standard library only) that the controller runs too, so that there is one copy of it."""
    spec = importlib.util.spec_from_file_location(name, CLIENT_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=1)
def _project_defaults() -> dict:
    with open(PROJECT_ROOT / "fabric.yaml", encoding="utf-8") as file:
        return yaml.safe_load(file)["lab"]


def _plain(value):
    """Mappings and sequences of any kind (Invoke's DataProxy, say) as dicts and lists."""
    if hasattr(value, "items"):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _merged(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def settings(overrides=None) -> dict:
    """fabric.yaml's `lab:` section with `overrides` merged in key by key: a fresh, plain copy."""
    return _merged(copy.deepcopy(_project_defaults()), _plain(overrides or {}))


def runtime_dir(lab: dict | None = None) -> Path:
    """The local runtime folder (absolute), from the given settings or fabric.yaml's."""
    path = Path((lab or settings())["runtime_dir"])
    return path if path.is_absolute() else PROJECT_ROOT / path
