"""The settings that name a path on this machine, checked before a command starts anything.

A user's mistake (a weights file that is not there, a results folder that
cannot be written) must not be found half-way through a deploy as a Python
traceback, nor in `fab run` as "a bug in the project". Each check raises a
UsageError whose one line names the setting (and its environment variable)
and the path.

    deploy:  lab.food11_weights, lab.blip_source (when it names a folder), the serving constraints
    results: lab.results_dir (fab bench, fab tune, fab run)

The target's own paths are checked by the target: an ssh host's --key
(provision/hosts.py), Chameleon's lab.chameleon.public_key and private_key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from provision import config
from provision.errors import UsageError

# A Hugging Face hub id: "name" or "namespace/name", nothing that reads as a path.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def name(*path: str) -> str:
    """How the user sets it: lab.food11_weights (FABRIC_LAB_FOOD11_WEIGHTS)."""
    return f"lab.{'.'.join(path)} ({config.ENV_PREFIX}{'_'.join(path).upper()})"


def readable_file(path: str, setting: str) -> None:
    """UsageError unless `path` is a file this process can read."""
    where = Path(os.path.expanduser(path))
    if where.is_dir():
        raise UsageError(f"{setting} is {path}: a folder, not a file")
    try:
        with open(where, "rb") as file:
            file.read(1)
    except FileNotFoundError:
        raise UsageError(f"{setting} is {path}: no such file") from None
    except OSError as error:
        raise UsageError(f"{setting} is {path}: cannot read it ({error.strerror})") from None


def readable_folder(path: str, setting: str) -> None:
    """UsageError unless `path` is a folder this process can list."""
    where = Path(os.path.expanduser(path))
    if not where.exists():
        raise UsageError(f"{setting} is {path}: no such folder")
    if not where.is_dir():
        raise UsageError(f"{setting} is {path}: a file, not a folder")
    try:
        os.listdir(where)
    except OSError as error:
        raise UsageError(f"{setting} is {path}: cannot read it ({error.strerror})") from None


def is_hub_id(source: str) -> bool:
    """Whether a BLIP source reads as a hub id (passed to the hosts as it is) rather than a local path."""
    return bool(HUB_ID.fullmatch(source)) and not Path(source).exists()


def check_weights(settings: dict) -> None:
    """lab.food11_weights and lab.blip_source (empty: the smoke weights, which `make weights` writes)."""
    from provision.smoke_weights import weight_sources

    weight_sources(settings)  # the smoke weights, where no weights are set
    if settings.get("food11_weights"):
        readable_file(settings["food11_weights"], name("food11_weights"))
    blip = settings.get("blip_source") or ""
    if blip and not is_hub_id(blip):
        readable_folder(blip, name("blip_source"))


def check_writable_folder(path: Path, setting: str) -> None:
    """UsageError unless `path` is a folder this process can write in, or one it can create."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{setting} is {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{setting} is {path}: {existing} cannot be written")


def check_results(settings: dict) -> None:
    """lab.results_dir: bench, tune and run write their runs there."""
    from provision.measure import results_root

    check_writable_folder(results_root(settings), name("results_dir"))


def check_deploy(settings: dict, constraints: str) -> None:
    """What `fab deploy` reads on this machine: the weights and the serving constraints file."""
    check_weights(settings)
    readable_file(str(config.PROJECT_ROOT / constraints), f"the serving constraints file {constraints}")
