"""The Ansible inventory, rendered from the state (inventory/hosts.yml.j2 -> inventory/hosts.yml)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jinja2

from provision import state as state_module
from provision.config import PROJECT_ROOT

TEMPLATE = PROJECT_ROOT / "inventory" / "hosts.yml.j2"


def inventory_file() -> Path:
    """Beside the state file (inventory/hosts.yml for the default state file)."""
    custom = os.environ.get("LAB_STATE_FILE")
    return Path(custom).with_name("hosts.yml") if custom else PROJECT_ROOT / "inventory" / "hosts.yml"


def known_hosts_file() -> Path:
    return state_module.state_file().with_name("known_hosts")


def render(state: state_module.State) -> Path:
    """Write the inventory for `state` atomically; return its path."""
    template = jinja2.Template(TEMPLATE.read_text(), undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = template.render(
        state_file=state_module.state_file(),
        hosts=state.hosts,
        controller_python=sys.executable,
        known_hosts=known_hosts_file(),
    )
    path = inventory_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text + "\n")
    temporary.replace(path)
    return path


def remove() -> None:
    inventory_file().unlink(missing_ok=True)
