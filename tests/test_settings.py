"""The `lab` settings in one order for every entry point: defaults < ~/.fabric.yaml < the project's
fabric.yaml < FABRIC_LAB_* < `fab -f FILE` < the task's flags. Real `fab` and `python -m` processes,
with a temporary HOME; the project-local file is that of a copy of the project's task files
(`fab --search-root`), so the checkout's own fabric.yaml is never touched."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from support.lab import FAB, new_lab

from provision.config import PROJECT_ROOT

KEY = "lab.ports.triton_http"


def shown(output: str, key: str = KEY) -> str:
    """`fab config`'s line for the key: 'value    <- where' (or the value alone: the default)."""
    line = next(line for line in output.splitlines() if line.startswith(f"{key} = "))
    return line.split(" = ", 1)[1]


@pytest.fixture
def levels(tmp_path):
    """A HOME, a project copy and an environment, each level setting the key its own way once asked."""
    home = tmp_path / "home"
    home.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    for name in ("tasks.py", "fabfile.py"):
        shutil.copy2(PROJECT_ROOT / name, project / name)
    env = {name: value for name, value in __import__("os").environ.items() if not name.startswith("FABRIC_LAB_")}
    env.update(HOME=str(home), LAB_STATE_FILE=str(tmp_path / "state" / "state.json"))

    def fab(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [FAB, "--search-root", str(project), *args], env=env, capture_output=True, text=True, timeout=120,
            check=check, cwd=tmp_path,
        )  # fmt: skip

    def python_m() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "provision.config"], env=env, capture_output=True, text=True, check=True,
            cwd=PROJECT_ROOT, timeout=120,
        )  # fmt: skip

    return {"home": home, "project": project, "env": env, "fab": fab, "python_m": python_m, "tmp": tmp_path}


def test_each_level_beats_the_one_before_in_fab_and_in_python_m(levels):
    fab, python_m, env = levels["fab"], levels["python_m"], levels["env"]
    assert shown(fab("config").stdout) == "8000" and shown(python_m().stdout) == "8000", "the default"

    (levels["home"] / ".fabric.yaml").write_text("lab:\n  ports:\n    triton_http: 7001\n")
    assert shown(fab("config").stdout) == f"7001    <- {levels['home'] / '.fabric.yaml'}"
    assert shown(python_m().stdout) == f"7001    <- {levels['home'] / '.fabric.yaml'}", "code outside Fabric too"

    (levels["project"] / "fabric.yaml").write_text("lab:\n  ports:\n    triton_http: 7002\n")
    assert shown(fab("config").stdout) == f"7002    <- {levels['project'] / 'fabric.yaml'}"

    env["FABRIC_LAB_PORTS_TRITON_HTTP"] = "7003"
    assert shown(fab("config").stdout) == "7003    <- environment (FABRIC_LAB_*)"
    assert shown(python_m().stdout) == "7003    <- environment (FABRIC_LAB_*)"

    runtime = levels["tmp"] / "run.yaml"
    runtime.write_text("lab:\n  ports:\n    triton_http: 7004\n")
    assert shown(fab("-f", str(runtime), "config").stdout) == f"7004    <- fab -f {runtime}"


def test_a_flag_beats_every_file_and_the_user_file_reaches_the_task(levels):
    fab = levels["fab"]
    (levels["home"] / ".fabric.yaml").write_text("lab:\n  target: ssh\n")
    refused = fab("provision", check=False)  # lab.target from the user's file: the ssh target, which needs --host
    assert refused.returncode == 1 and "the ssh target needs at least one host" in refused.stderr, refused.stderr
    done = fab("provision", "--target", "local")  # the flag wins
    assert "local" in done.stdout and "next: fab deploy" in done.stdout
    fab("teardown")


def test_a_misspelled_key_is_named_with_the_closest_real_one(levels):
    fab, python_m, env = levels["fab"], levels["python_m"], levels["env"]
    (levels["home"] / ".fabric.yaml").write_text("lab:\n  prots:\n    triton_http: 7001\n")
    env["FABRIC_LAB_PORTS_TRITON_HTP"] = "7003"
    output = fab("config")
    assert f"warning: lab.prots.triton_http in {levels['home'] / '.fabric.yaml'} is no setting: did you mean " \
           "lab.ports.triton_http?" in output.stderr  # fmt: skip
    assert "warning: FABRIC_LAB_PORTS_TRITON_HTP is no setting: did you mean FABRIC_LAB_PORTS_TRITON_HTTP?" in output.stderr
    assert shown(output.stdout) == "8000", "nothing changed"
    outside_fab = python_m()
    assert "did you mean lab.ports.triton_http?" in outside_fab.stderr and shown(outside_fab.stdout) == "8000"


@pytest.mark.parametrize(("word", "meaning"), [("false", "false"), ("No", "false"), ("0", "false"), ("yes", "true"),
                                               ("TRUE", "true"), ("1", "true")])  # fmt: skip
def test_a_boolean_variable_reads_the_words_people_write(levels, word, meaning):
    levels["env"]["FABRIC_LAB_DOCKER_REMOVE_IMAGES"] = word  # its default: true
    assert shown(levels["fab"]("config").stdout, "lab.docker.remove_images").split()[0] == meaning


def test_a_value_of_the_wrong_type_is_refused_naming_the_setting_and_where_it_was_set(levels):
    fab, env, home = levels["fab"], levels["env"], levels["home"]
    env["FABRIC_LAB_BENCH_QUICK_MAX_TRIALS"] = "abc"
    named = 'lab.bench.quick.max_trials is "abc" (FABRIC_LAB_BENCH_QUICK_MAX_TRIALS): give a number'
    for task in (["config"], ["provision"], ["bench", "--quick"]):  # before anything starts
        done = fab(*task, check=False)
        assert done.returncode == 1 and f"error: {named}" in done.stderr and "Traceback" not in done.stderr, done
    # Teardown says so and goes on: a bad setting must not keep what was provisioned running.
    done = fab("teardown", check=False)
    assert done.returncode == 0 and f"warning: {named}" in done.stderr, done
    env["FABRIC_LAB_BENCH_QUICK_MAX_TRIALS"] = "2.5"
    assert fab("config").returncode == 0, "a number where the default is whole is a number all the same"
    del env["FABRIC_LAB_BENCH_QUICK_MAX_TRIALS"]
    env["FABRIC_LAB_MODELS_GPU_DECODE"] = "maybe"
    assert 'lab.models.gpu_decode is "maybe" (FABRIC_LAB_MODELS_GPU_DECODE): give true or false' in fab(
        "config", check=False).stderr  # fmt: skip
    del env["FABRIC_LAB_MODELS_GPU_DECODE"]
    (home / ".fabric.yaml").write_text("lab:\n  bench:\n    quick:\n      max_trials: abc\n")
    done = fab("bench", "--quick", check=False)
    assert f'error: lab.bench.quick.max_trials is "abc" ({home / ".fabric.yaml"}): give a number' in done.stderr
    assert not (levels["tmp"] / "results").exists(), "nothing written"
    (home / ".fabric.yaml").unlink()
    runtime = levels["tmp"] / "runtime.yaml"
    runtime.write_text("lab:\n  ports:\n    api: [8080]\n")
    assert f'error: lab.ports.api is [8080] (fab -f {runtime}): give a number' in fab(
        "-f", str(runtime), "config", check=False).stderr  # fmt: skip


def test_config_never_prints_a_secret_only_whether_it_is_set(levels):
    levels["env"]["OS_APPLICATION_CREDENTIAL_SECRET"] = "s3cr3t-value"
    output = levels["fab"]("config").stdout
    assert "OS_APPLICATION_CREDENTIAL_SECRET set" in output and "s3cr3t-value" not in output


def test_the_tests_own_labs_are_unchanged(tmp_path):
    lab = new_lab(tmp_path)  # FABRIC_LAB_* as every other test sets them
    output = lab.fab("config").stdout
    assert shown(output) == f"{lab.ports['triton_http']}    <- environment (FABRIC_LAB_*)"


def test_fab_config_names_the_state_file_in_use(tmp_path):
    lab = new_lab(tmp_path)
    shown_lines = lab.fab("config").stdout.splitlines()
    assert f"state file: {lab.state_file}    <- LAB_STATE_FILE" in shown_lines
