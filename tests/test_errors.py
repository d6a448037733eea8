"""Every error meant for the user is a LabError (provision/errors.py): each task answers with an
"error:" line and no traceback. Here every task meets a deployed state whose one host cannot be
reached (nothing listens on its SSH port), as after a node went away."""

from __future__ import annotations

import importlib
import subprocess

import pytest
from support.lab import new_lab

from provision import inventory
from provision import state as state_module
from provision.config import settings as lab_settings
from provision.errors import LabError, OperationError, UsageError
from provision.host.background import free_ports
from provision.state import Host, State


def unreachable_deployment(lab, tmp_path) -> str:
    """A state file: the ssh target, one deployed host at 127.0.0.1 on a port where nothing listens."""
    port = free_ports(1)[0]
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = Host(name="gone", address="127.0.0.1", port=port, user="root", key=str(key), python="/usr/bin/python3")
    state = State(target="ssh", hosts=[host], runtime="process")
    home = str(lab.root / "deploy-remote")
    state.deploy = {
        "status": "deployed", "home": home, "ports": lab_settings()["ports"],
        "hosts": {"gone": {"home": home, "host_python": "/usr/bin/python3", "serving_python": "/usr/bin/python3"}},
        "bind_address": "127.0.0.1", "bind_addresses": {"gone": "127.0.0.1"}, "cluster": {},
    }  # fmt: skip
    state_module.save(state, lab.state_file)
    with pytest.MonkeyPatch.context() as patch:  # the inventory beside the lab's state file, as provision writes it
        patch.setenv("LAB_STATE_FILE", str(lab.state_file))
        inventory.render(state)
    return f"127.0.0.1:{port}"


TASKS = [
    ["deploy"],
    ["bench", "--quick", "--model", "food_classifier"],
    ["tune", "--quick", "--model", "batching_food_classifier", "--p99-ms", "500"],
    ["logs"],
    ["tunnel"],
    ["extend", "--hours", "1"],
    ["run"],
    ["teardown"],
]


@pytest.mark.parametrize("args", TASKS, ids=[args[0] for args in TASKS])
def test_every_task_on_an_unreachable_host_says_so_without_a_traceback(tmp_path, args):
    lab = new_lab(tmp_path)
    unreachable_deployment(lab, tmp_path)
    done = lab.fab(*args, check=False, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, f"one error line:\n{done.stderr}"
    assert lab.state() is not None, "the state is kept: the host may come back, teardown --purge forgets it"


def test_status_reports_the_unreachable_host_and_succeeds(tmp_path):
    lab = new_lab(tmp_path)
    where = unreachable_deployment(lab, tmp_path)
    done = lab.fab("status", check=False, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "gone" in done.stdout and where.split(":")[0] in done.stdout


def test_every_error_class_meant_for_the_user_has_the_one_root():
    for module in ("ansible", "bench", "cluster", "flags", "gpu_preflight", "hosts", "lease_guard", "lock",
                   "model_repo", "runtimes", "state", "targets", "targets.chameleon.cloud", "teardown", "tune",
                   "tunnel"):  # fmt: skip
        importlib.import_module(f"provision.{module}")

    found = {cls.__name__ for cls in _subclasses(LabError)}
    assert {
        "UsageError", "OperationError", "FlagError", "ClusterError", "UnknownTarget", "UnknownRuntime", "TuningError",
        "PreflightError", "LockBusy", "LeaseTooShort", "TuneError", "PlaybookError", "PlaybookInterrupted",
        "BenchError", "ChameleonError", "CredentialsError", "NoHostsError", "LeaseNotUsable", "TunnelError",
        "HostError", "StateError", "TeardownError",
    } <= found  # fmt: skip
    assert issubclass(UsageError, ValueError) and issubclass(OperationError, RuntimeError), "old catches still work"


def _subclasses(cls) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]
