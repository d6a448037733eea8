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
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provision.config import PROJECT_ROOT

STATE_VERSION = 1
DEFAULT_STATE_FILE = PROJECT_ROOT / ".state" / "state.json"


class StateError(RuntimeError):
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
    """The recorded state, or None when nothing is provisioned."""
    path = path or state_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as error:
        raise StateError(f"{path} is not valid JSON ({error}): fix it or remove it after checking the cloud") from None
    if data.get("version") != STATE_VERSION:
        raise StateError(f"{path} has state version {data.get('version')}, this code reads {STATE_VERSION}")
    return State.from_json(data)


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
