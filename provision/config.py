"""The project defaults, read from fabric.yaml (the file Fabric reads for tasks.py).

Fabric tasks get these through their context (`c.lab`); code that runs outside
Fabric (tests, `python -m provision.local_triton`) reads the same file here, so
every default lives in one place.
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


def defaults() -> dict:
    """A fresh copy of the `lab:` section of fabric.yaml."""
    return copy.deepcopy(_project_defaults())


def runtime_dir(settings: dict | None = None) -> Path:
    """The local runtime folder (absolute)."""
    settings = settings or defaults()
    path = Path(settings["runtime_dir"])
    return path if path.is_absolute() else PROJECT_ROOT / path
