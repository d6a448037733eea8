"""The local state record: what `fab provision` created, read by every later task.

One JSON file (default .state/state.json under the project), written
atomically (temporary file + rename) after every step, so an interrupted
command leaves a state the next command can continue from or clean up.
Secrets never go in here: the state names resources, it never holds
credentials (tests check this).

    {
      "version": 1,
      "target": "local" | "ssh" | "chameleon",
      "hosts": [{"name": "node-1", "address": "127.0.0.1", "port": 22, "user": "cc",
                 "key": "~/.ssh/id_rsa", "connection": "ssh" | "local"}],
      "runtime": "process" | "docker",
      "serving_venv": null | "/path/to/venv",   # an existing serving environment to reuse
      "chameleon": {...},                       # resources of the chameleon target
      "deploy": {...},                          # what `fab deploy` put on the hosts
      "history": [{"at": "...", "event": "..."}]
    }
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provision.config import PROJECT_ROOT
from provision.errors import OperationError

STATE_VERSION = 1
DEFAULT_STATE_FILE = PROJECT_ROOT / ".state" / "state.json"


class StateError(OperationError):
    """No usable state: the message says which command to run."""


@dataclass
class Host:
    name: str
    address: str
    port: int = 22
    user: str = ""
    key: str | None = None  # path of the private key (never its contents)
    connection: str = "ssh"  # "ssh" or "local" (Ansible's ansible_connection)
    python: str | None = None  # the host's Python for Ansible; None: Ansible discovers it
    # Where the other hosts reach it (a cluster's balancer reaches its Triton there); None: address.
    private_address: str | None = None


@dataclass
class State:
    target: str
    hosts: list[Host] = field(default_factory=list)
    runtime: str = "process"
    serving_venv: str | None = None
    chameleon: dict = field(default_factory=dict)
    deploy: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    version: int = STATE_VERSION

    def record(self, event: str) -> None:
        self.history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event})

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> State:
        data = dict(data)
        hosts = [Host(**host) for host in data.pop("hosts", [])]
        return cls(hosts=hosts, **data)


def state_file() -> Path:
    """LAB_STATE_FILE overrides the default, so tests and parallel setups keep apart."""
    return Path(os.environ.get("LAB_STATE_FILE") or DEFAULT_STATE_FILE)


def load(path: Path | None = None) -> State | None:
    """The recorded state, or None when nothing is provisioned.

    StateError when the file is not a state this code can read (not JSON, another
    version, a field missing or of the wrong kind): the message names the file, what
    is wrong and what to do. The file itself is left as it is.
    """
    path = path or state_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise StateError(f"cannot read the state file {path}: {error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise StateError(_unreadable(path, f"it is not valid JSON ({error})", None)) from None
    if isinstance(data, dict) and "version" in data and data["version"] != STATE_VERSION:
        raise StateError(f"{path} has state version {data.get('version')}, this code reads {STATE_VERSION}")
    problems = _problems(data)
    if problems:
        raise StateError(_unreadable(path, "; ".join(problems), data))
    return State.from_json(data)


# The fields of a state file and the kind of value each holds (State and Host above).
_FIELDS = {
    "version": int, "target": str, "hosts": list, "runtime": str, "serving_venv": (str, type(None)),
    "chameleon": dict, "deploy": dict, "history": list,
}  # fmt: skip
_HOST_FIELDS = {
    "name": str, "address": str, "port": int, "user": str, "key": (str, type(None)), "connection": str,
    "python": (str, type(None)), "private_address": (str, type(None)),
}  # fmt: skip


class _Targets:
    """What the targets know of their own records, which provision.targets registers here (it imports
    this module, so this one cannot import it): their names, the problems of a target's record
    (State.chameleon) and the cloud resources it names, each a function of (target, record)."""

    names: tuple[str, ...] = ()
    record_problems: Callable[[str, dict], list[str]] = staticmethod(lambda target, record: [])
    recorded_resources: Callable[[str, dict], list[str]] = staticmethod(lambda target, record: [])


def register_targets(names: tuple[str, ...], record_problems, recorded_resources) -> None:
    _Targets.names = tuple(names)
    _Targets.record_problems = staticmethod(record_problems)
    _Targets.recorded_resources = staticmethod(recorded_resources)


def _problems(data) -> list[str]:
    """What makes `data` not a state: [] for a good one."""
    if not isinstance(data, dict):
        return [f"it holds a JSON {type(data).__name__}, not an object"]
    problems = [f'"{name}" is missing' for name in _FIELDS if name not in data]
    problems += [f'"{name}" is not a known field' for name in data if name not in _FIELDS]
    problems += [
        f'"{name}" is {json.dumps(data[name])[:60]}, not {_kind(kind)}'
        for name, kind in _FIELDS.items()
        if name in data and not isinstance(data[name], kind)
    ]
    if isinstance(data.get("target"), str) and _Targets.names and data["target"] not in _Targets.names:
        problems.append(f'"target" is {data["target"]!r}, not one of {", ".join(_Targets.names)}')
    for number, host in enumerate(data.get("hosts") if isinstance(data.get("hosts"), list) else []):
        if not isinstance(host, dict):
            problems.append(f"host {number + 1} is not an object")
            continue
        problems += [f'host {number + 1} has no "{name}"' for name in ("name", "address") if name not in host]
        problems += [f'host {number + 1} has "{name}", not a known field' for name in host if name not in _HOST_FIELDS]
        problems += [
            f'host {number + 1}\'s "{name}" is not {_kind(kind)}'
            for name, kind in _HOST_FIELDS.items()
            if name in host and not isinstance(host[name], kind)
        ]
    if not problems and data["target"] in _Targets.names:
        problems += _Targets.record_problems(data["target"], data["chameleon"])
    return problems


def _kind(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "a number", list: "a list", dict: "an object", type(None): "null"}
    return " or ".join(names[k] for k in kinds)


def _unreadable(path: Path, what: str, data) -> str:
    """The message for a state file that cannot be used: what is wrong, and what to check before removing it."""
    message = f"the state file {path} is not a state this code can read: {what}.\n"
    cloud = _cloud_resources(data if data is not None else {}, path)
    if cloud:
        message += (
            "It records Chameleon resources, which may still exist (and count against your allocation). "
            "Check them in the dashboard or with the openstack CLI before removing the file:\n"
            + "\n".join(f"  {line}" for line in cloud)
            + "\n"
        )
    else:
        message += (
            "If a deployment of ours may still run on its hosts, fix the file by hand (provision/state.py "
            "describes it) and run `fab teardown`.\n"
        )
    return message + f"To start afresh: move it away (mv {path} {path}.broken) and run `fab provision`."


def _cloud_resources(data, path: Path) -> list[str]:
    """The cloud resources a broken file still names, read as far as it can be read."""
    if isinstance(data, dict) and data.get("target") in _Targets.names and isinstance(data.get("chameleon"), dict):
        return _Targets.recorded_resources(data["target"], data["chameleon"])
    # Not even a state's shape: the ids in the text itself.
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    ids = sorted(set(re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", text)))
    return [f"id {found}" for found in ids]


def require(path: Path | None = None) -> State:
    """The recorded state; raise StateError telling the user to provision first."""
    state = load(path)
    if state is None:
        raise StateError("nothing is provisioned: run `fab provision` first (e.g. `fab provision --target local`)")
    return state


def save(state: State, path: Path | None = None) -> Path:
    """Write the state atomically: readers see the old file or the new one, never half."""
    path = path or state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".state-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(state.to_json(), file, indent=2)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def clear(path: Path | None = None) -> bool:
    """Forget the state (after its resources are verified gone). True if there was one."""
    path = path or state_file()
    if path.exists():
        path.unlink()
        return True
    return False
