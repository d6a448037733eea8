"""Static checks of what deploys the lab: ansible-lint over playbooks/ and hadolint over the Dockerfiles.

Both tools are dev extras installed into the project's venv (`make setup`), so
they are taken from beside this interpreter; a missing tool is a failure, not a skip.
ansible-lint reads .ansible-lint at the project root (production profile, offline).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision import config

VENV_BIN = Path(sys.executable).parent
PLAYBOOKS = config.PROJECT_ROOT / "playbooks"
DOCKERFILES = sorted(path.name for path in config.PROJECT_ROOT.glob("Dockerfile*"))


def venv_tool(name: str) -> str:
    tool = shutil.which(name, path=str(VENV_BIN))
    assert tool is not None, f"{name} is not installed in {VENV_BIN}: run `make setup` (it installs the dev extra)"
    return tool


def test_the_playbooks_pass_ansible_lint_with_the_production_profile():
    ansible_lint = venv_tool("ansible-lint")
    # ansible-lint wants its own bin folder on PATH (it warns and adds it otherwise).
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    command = [ansible_lint, "--nocolor", "--offline", "--profile", "production", "-c", ".ansible-lint", "playbooks"]
    done = subprocess.run(command, cwd=config.PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"ansible-lint (production profile) failed on playbooks/:\n{output}"
    # A pass that looked at nothing (a bad exclude_paths) is no pass.
    processed = re.search(r"in (\d+) files processed", output)
    yaml_files = list(PLAYBOOKS.rglob("*.yml"))
    assert processed and int(processed.group(1)) >= len(yaml_files), output


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_dockerfile_is_hadolint_clean(dockerfile):
    hadolint = venv_tool("hadolint")
    done = subprocess.run([hadolint, dockerfile], cwd=config.PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"hadolint {dockerfile}:\n{done.stdout}{done.stderr}"


def test_both_dockerfiles_are_linted():
    assert {"Dockerfile.api", "Dockerfile.triton"} <= set(DOCKERFILES)
