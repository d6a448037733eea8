"""Runtime `process`: tritonserver, the API and Jupyter as processes from a virtualenv.

On the host, provision.host.process_runtime starts, stops and reports them; the
serving torch is the target's (runtimes.serving_pins' default). Ansible tasks:
playbooks/runtimes/process/.
"""

from __future__ import annotations

import shlex

from provision.host.layout import LIB_DIR, RUNTIME_JSON


def host_command(deployed: dict, subcommand: str) -> str:
    home = deployed["home"]
    return (
        f"PYTHONPATH={shlex.quote(f'{home}/{LIB_DIR}')} {shlex.quote(deployed['serving_python'])} "
        f"-m provision.host.process_runtime --config {shlex.quote(f'{home}/{RUNTIME_JSON}')} {subcommand}"
    )
