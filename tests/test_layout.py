"""The two axes of the pipeline, targets and runtimes, each declared once and routed by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provision import runtimes, targets

ROOT = Path(__file__).resolve().parent.parent
AXES = (ROOT / "provision" / "targets", ROOT / "provision" / "runtimes")
NAME_COMPARISON = re.compile(r"""(runtime|target)[]"')]* *(==|!=) *["'](docker|process|local|ssh|chameleon)["']""")


def test_no_code_outside_the_two_axes_compares_their_names():
    files = [ROOT / "tasks.py", *sorted((ROOT / "provision").rglob("*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        if not any(axis in path.parents for axis in AXES)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_COMPARISON.search(line)
    ]
    assert found == [], "route it through provision.targets or provision.runtimes instead"


def test_the_playbooks_choose_the_runtime_s_tasks_once_instead_of_testing_its_name():
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in sorted((ROOT / "playbooks").rglob("*.yml"))
        for line in path.read_text().splitlines()
        if "lab_runtime" in line and "lab_runtime_tasks" not in line
    ]
    assert found == []


@pytest.mark.parametrize("runtime", runtimes.RUNTIMES)
def test_every_runtime_has_its_module_its_host_helper_and_its_task_files(runtime):
    module = runtimes.get(runtime)
    assert callable(getattr(module, "host_command", None)), f"{runtime} has no host-side helper"
    for playbook in ("deploy.yml", "teardown.yml"):
        assert (Path(runtimes.tasks_folder(runtime)) / playbook).is_file(), f"{runtime} has no {playbook}"


@pytest.mark.parametrize("target", targets.TARGETS)
def test_every_target_provisions(target):
    assert callable(getattr(targets.get(target), "provision", None))


def test_an_unknown_name_on_either_axis_names_the_choices():
    with pytest.raises(targets.UnknownTarget, match="unknown target 'slurm': choose one of local, ssh, chameleon"):
        targets.deploy_dir("slurm", {}, None)
    with pytest.raises(runtimes.UnknownRuntime, match="unknown runtime 'k8s': choose one of process, docker"):
        runtimes.tasks_folder("k8s")


def test_a_target_without_an_operation_of_its_own_gets_the_declared_default():
    settings = {"remote_deploy_dir": "~/triton-lab", "local_deploy_dir": "/srv/lab", "runtime": ""}
    assert targets.deploy_dir("ssh", settings, None) == "~/triton-lab"  # the default
    assert targets.deploy_dir("local", settings, None) == "/srv/lab"  # local's own
    assert targets.deadline("ssh", None, settings) is None
    assert targets.default_runtime("ssh", settings) == "process"
    assert targets.default_runtime("chameleon", settings) == "docker"
