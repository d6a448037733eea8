"""Drive the real `fab` command line as a user would, with a private state and free ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from provision.config import PROJECT_ROOT
from provision.host.background import free_ports, port_is_free
from provision.host.layout import run_dir
from provision.host.tritonserver import SHM_DIR, TritonProcess
from support import budget

FAB = str(Path(sys.executable).parent / "fab")


@dataclass
class Lab:
    """One isolated user of the project: own state file, deploy folders, results and ports."""

    root: Path
    ports: dict
    extra_env: dict = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.root / "state" / "state.json"

    @property
    def results_dir(self) -> Path:
        return self.root / "results"

    def env(self) -> dict:
        # The caller's own FABRIC_LAB_* settings (a developer's shell) must not reach the tests' users.
        env = {name: value for name, value in os.environ.items() if not name.startswith("FABRIC_LAB_")}
        env.update(
            {
                "LAB_STATE_FILE": str(self.state_file),
                "FABRIC_LAB_LOCAL_DEPLOY_DIR": str(self.root / "deploy-local"),
                "FABRIC_LAB_REMOTE_DEPLOY_DIR": str(self.root / "deploy-remote"),
                "FABRIC_LAB_RESULTS_DIR": str(self.results_dir),
            }
        )
        for name, port in self.ports.items():
            env[f"FABRIC_LAB_PORTS_{name.upper()}"] = str(port)
        env.update(self.extra_env)
        return env

    def fab(self, *args: str, check: bool = True, timeout: float = 900, env: dict | None = None, stdin: str = ""):
        """Run `fab ARGS` as this user; env replaces the whole environment when given."""
        started = time.monotonic()
        done = subprocess.run(
            [FAB, *args], cwd=PROJECT_ROOT, env=env or self.env(), capture_output=True, text=True, timeout=timeout,
            input=stdin,
        )  # fmt: skip
        _record_time(args, time.monotonic() - started)
        budget.count(args, self.runtime())
        if check and done.returncode != 0:
            raise AssertionError(f"fab {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def popen_fab(self, *args: str) -> subprocess.Popen:
        budget.count(args, self.runtime())
        return subprocess.Popen(
            [FAB, *args],
            cwd=PROJECT_ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def state(self) -> dict | None:
        return json.loads(self.state_file.read_text()) if self.state_file.exists() else None

    def runtime(self) -> str | None:
        """The runtime this user provisioned (None: nothing provisioned yet)."""
        try:
            return (self.state() or {}).get("runtime")
        except ValueError:  # a test's deliberately broken state file
            return None


def _record_time(args: tuple[str, ...], seconds: float) -> None:
    """LAB_FAB_TIMINGS=FILE: one line per `fab` command the tests run (where a slow test spends its time)."""
    timings = os.environ.get("LAB_FAB_TIMINGS")
    if timings:
        with open(timings, "a") as out:
            out.write(f"{seconds:7.1f}s  {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}  fab {' '.join(args)}\n")


def our_processes(folder: Path) -> list[str]:
    """Processes whose command line mentions `folder` (our services run from there)."""
    done = subprocess.run(["pgrep", "-a", "-f", "--", f"{folder}/"], capture_output=True, text=True)
    return done.stdout.splitlines()


PORT_NAMES = (
    "triton_http", "triton_grpc", "triton_metrics", "api", "jupyter", "balancer_http", "balancer_grpc", "balancer_stats",
)  # fmt: skip


def triton_shm_regions(deploy_dir: Path) -> list[Path]:
    """The python backend's shared memory of the Triton deployed in deploy_dir (its own prefix)."""
    prefix = TritonProcess(deploy_dir / "triton", deploy_dir / "models", run_dir(deploy_dir)).shm_prefix
    return sorted(SHM_DIR.glob(f"{prefix}*"))


def assert_nothing_of_ours_is_left(lab: Lab, deploy_dir: Path) -> None:
    """What a teardown promises on this machine: the state cleared, nothing that deploy put on the host
    (deploy_dir), no process of ours, no port of ours listening, no shared memory of our Triton."""
    assert lab.state() is None, "the state is cleared"
    assert our_processes(deploy_dir) == [], "a process of ours survived the teardown"
    assert not deploy_dir.exists(), "teardown removes what deploy put on the host"
    assert all(port_is_free(port, "127.0.0.1") for port in lab.ports.values()), "a port of ours still listens"
    assert triton_shm_regions(deploy_dir) == [], "shared memory of our Triton is left in /dev/shm"


def new_lab(tmp_path) -> Lab:
    """A user of the project with a private state file, deploy folders, results and free ports."""
    return Lab(tmp_path, ports=dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)))))
