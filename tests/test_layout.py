"""The code's layout: host code apart from controller code; targets and runtimes, each declared once."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import yaml

from provision import runtimes, targets
from provision.routing import _check_implements

ROOT = Path(__file__).resolve().parent.parent
AXES = (ROOT / "provision" / "targets", ROOT / "provision" / "runtimes")
HOST = ROOT / "provision" / "host"
NAME_COMPARISON = re.compile(r"""(runtime|target)[]"')]* *(==|!=) *["'](docker|process|local|ssh|chameleon)["']""")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """(absolute module name, node) of every import in a file's tree, nested ones too."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((base, node))
            found += [(f"{base}.{alias.name}", node) for alias in node.names]  # `from pkg import module`
    return found


def _optional_imports(tree: ast.AST) -> set[int]:
    """ids of the imports inside `try: ... except ImportError`: probes of what a host has, not dependencies."""
    probes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(handler.type, ast.Name) and handler.type.id in ("ImportError", "ModuleNotFoundError")
            for handler in node.handlers
        ):
            probes |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return probes


def test_code_that_runs_on_the_hosts_imports_only_the_standard_library_and_itself():
    found = []
    for path in sorted(HOST.rglob("*.py")):
        tree = ast.parse(path.read_text())
        probes = _optional_imports(tree)
        for name, node in _imports(path, tree):
            if isinstance(node, ast.ImportFrom) and name != (node.module or ""):
                continue  # a name taken from a module: the module itself is checked
            standard = name.split(".")[0] in sys.stdlib_module_names
            ours = name == "provision" or name == "provision.host" or name.startswith("provision.host.")
            if not (standard or ours or id(node) in probes):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert found == [], "host code runs where only the standard library and provision/host/ are there"


def test_no_module_of_provision_imports_one_that_imports_it_back():
    paths = {_module_name(path): path for path in (ROOT / "provision").rglob("*.py")}
    graph = {
        name: {
            imported
            for imported, _ in _imports(path, ast.parse(path.read_text()))
            # a module's own packages are imported with it: no edge to them
            if imported in paths and imported != name and not name.startswith(imported + ".")
        }
        for name, path in paths.items()
    }
    cycles, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        for imported in sorted(graph[name]):
            if imported in trail:
                cycles.append(" -> ".join(trail[trail.index(imported) :] + [imported]))
            elif imported not in done:
                visit(imported, trail + [imported])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert cycles == []


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


def _operations(axis) -> dict:
    """{name: declaration} of an axis's routed operations."""
    return {
        name: op.__wrapped__ for name, op in vars(axis).items()
        if callable(op) and getattr(getattr(op, "__wrapped__", None), "__module__", "") == axis.__name__
    }  # fmt: skip


@pytest.mark.parametrize(("axis", "names"), [(targets, targets.TARGETS), (runtimes, runtimes.RUNTIMES)], ids=["targets", "runtimes"])
def test_every_module_s_operation_takes_the_declared_parameters(axis, names):
    operations = _operations(axis)
    assert len(operations) > 5
    for name in names:
        module = axis.get(name)
        for op_name, declared in operations.items():
            if hasattr(module, op_name):
                _check_implements(getattr(module, op_name), declared, f"{name}.{op_name}")  # raises on a mismatch


def test_a_call_that_does_not_fit_the_declaration_fails_at_once_naming_it():
    with pytest.raises(TypeError, match=r"provision.targets.deploy_dir\(settings: .*: missing a required argument: 'state'"):
        targets.deploy_dir("ssh", {})

    def deploy_dir(state, settings):  # the parameters swapped
        return ""

    with pytest.raises(TypeError, match=r"x.deploy_dir\(state, settings\) does not match its declaration"):
        _check_implements(deploy_dir, _operations(targets)["deploy_dir"], "x.deploy_dir")


def test_one_place_answers_whether_a_host_is_this_machine():
    """hosts.is_this_machine (and the inventory template, which renders Ansible's local connection)."""
    files = [ROOT / "tasks.py", *sorted((ROOT / "provision").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    asking = [
        str(path.relative_to(ROOT)) for path in files
        if path != ROOT / "provision" / "hosts.py" and re.search(r"connection\s*[!=]=\s*[\"']local", path.read_text())
    ]  # fmt: skip
    assert asking == []


def test_the_deploy_reaches_nothing_of_the_local_serving_stack():
    paths = {_module_name(path): path for path in (ROOT / "provision").rglob("*.py")}
    reached, waiting = set(), ["provision.deploy"]
    while waiting:
        name = waiting.pop()
        reached.add(name)
        imported = {module for module, _ in _imports(paths[name], ast.parse(paths[name].read_text()))}
        waiting += [module for module in imported if module in paths and module not in reached]
    assert "provision.local_serving" not in reached


ROLES = sorted((ROOT / "playbooks" / "roles").glob("*/defaults/main.yml"))


@pytest.mark.parametrize("defaults", ROLES, ids=lambda path: path.parent.parent.name)
def test_a_role_s_defaults_are_plain_values_that_read_nothing_of_the_project(defaults):
    text = defaults.read_text()
    assert "{{" not in text, "a derived value belongs in the role's vars/main.yml"
    assert "lab_" not in text and "lab." not in text, "the play maps the project's settings (vars/role_settings.yml)"


def test_the_project_s_settings_reach_the_roles_in_one_place_under_names_the_roles_declare():
    declared = {name for path in ROLES for name in yaml.safe_load(path.read_text())}
    mapping = yaml.safe_load((ROOT / "playbooks" / "vars" / "role_settings.yml").read_text())
    assert [name for name in mapping if name not in declared] == []
    for playbook in ("deploy.yml", "teardown.yml"):
        for play in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()):
            assert play["vars_files"] == ["vars/role_settings.yml"], (playbook, play["name"])


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in a Python file's code (docstrings and comments aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_one_module_knows_the_run_folder_s_format_and_one_writes_it():
    """client_scripts/run_folder.py names the parts of results/<run-id>/; provision/measure.py writes them."""
    owners = {ROOT / "client_scripts" / "run_folder.py", ROOT / "provision" / "measure.py"}
    files = [ROOT / "tasks.py", *sorted((ROOT / "provision").rglob("*.py")), *sorted((ROOT / "client_scripts").glob("*.py"))]
    naming = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in files if path not in owners
        for line, text in _string_constants(path)
        if text.strip("/") in ("summary.json", "PARTIAL.md")
    ]  # fmt: skip
    assert naming == [], "read and write a run through provision.measure (client_scripts: run_folder)"
    writers = [
        str(path.relative_to(ROOT)) for path in files if path not in owners
        if re.search(r"\.write_summary\(|\.mark_partial\(", path.read_text()) and path.parent.name != "provision"
    ]  # fmt: skip
    assert writers == [], "only the controller writes runs"


def test_the_benchmarks_go_through_the_two_axes_and_not_through_the_tests():
    found = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NAME_COMPARISON.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: compares a name: {line.strip()}")
            if re.search(r"""["']tests["']|\bfrom tests\b|\bimport tests\b""", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: reaches into tests/: {line.strip()}")
    assert found == []


def test_the_tests_share_code_through_their_support_package_only():
    """tests/support/ holds what the tests share; conftest.py holds fixtures, and no test imports it or another test."""
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for name, _ in _imports(path, ast.parse(path.read_text()))
        if name.split(".")[0] in ("conftest", "tests") or name.split(".")[0].startswith("test_")
    ]
    assert found == []
    loose = [path.name for path in (ROOT / "tests").glob("*.py") if not path.name.startswith(("test_", "conftest"))]
    assert loose == [], "shared test code goes in tests/support/"
