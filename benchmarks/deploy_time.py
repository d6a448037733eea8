"""How long `fab deploy` takes on the local target: a full deploy (after `make`), then a no-change re-deploy.

    .venv/bin/python benchmarks/deploy_time.py [--repeat 2] [--runtime docker]

Runs as an isolated user (own state file, deploy folder and free ports), so it
does not disturb a deployment you already have, and tears down at the end.
Prints each time and the ratio. The machine is noisy: compare within one run.

--runtime docker measures the process runtime and the docker runtime side by
side. The docker runtime's full deploy is cold: no image of ours and no build
cache (teardown removes the images, the builder cache is pruned before each
run); the base images stay, as a registry's would be cached on a node. It uses
the engine and stand-in bases of the tests (tests/docker_engine.py, `make
docker-bases`) unless FABRIC_LAB_DOCKER_ENGINE_HOST names another engine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAB = str(Path(sys.executable).parent / "fab")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import docker_engine  # noqa: E402

from provision.background import free_ports  # noqa: E402

PORTS = ("triton_http", "triton_grpc", "triton_metrics", "api", "jupyter")


def fab(env: dict, *args: str) -> float:
    """Run `fab ARGS`; return its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run([FAB, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"fab {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def docker_env(env: dict) -> dict:
    """The environment of a docker-runtime user: the tests' engine and bases unless another engine is named."""
    if env.get("FABRIC_LAB_DOCKER_ENGINE_HOST"):
        return env
    docker_engine.start()
    docker_engine.bases()
    return env | docker_engine.settings() | {"FABRIC_LAB_DOCKER_PROJECT": "triton-lab-deploy-time"}


def cold_start(env: dict) -> None:
    """No build cache: the next deploy builds both images from scratch."""
    engine = env["FABRIC_LAB_DOCKER_ENGINE_HOST"]
    subprocess.run(
        ["docker", "--host", engine, "builder", "prune", "--all", "--force"], check=True, capture_output=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="full + no-change pairs to measure (default 2)")
    parser.add_argument("--runtime", choices=["process", "docker"], default="process",
                        help="docker: both runtimes side by side (default: process only)")  # fmt: skip
    args = parser.parse_args()
    runtimes = ["process", "docker"] if args.runtime == "docker" else ["process"]
    with tempfile.TemporaryDirectory(prefix="deploy-time-") as folder:
        env = dict(os.environ, LAB_STATE_FILE=f"{folder}/state/state.json",
                   FABRIC_LAB_LOCAL_DEPLOY_DIR=f"{folder}/deploy")  # fmt: skip
        env.update({f"FABRIC_LAB_PORTS_{name.upper()}": str(port) for name, port in zip(PORTS, free_ports(len(PORTS)))})
        rows = []
        for attempt in range(1, args.repeat + 1):
            for runtime in runtimes:  # interleaved: both see the same machine load
                run_env = docker_env(env) if runtime == "docker" else env
                if runtime == "docker":
                    cold_start(run_env)
                fab(run_env, "provision", "--target", "local", "--runtime", runtime)
                full = fab(run_env, "deploy")
                again = fab(run_env, "deploy")
                fab(run_env, "teardown")
                rows.append((attempt, runtime, full, again))
        print(f"{'run':>3}  {'runtime':<8} {'full deploy s':>13}  {'no-change re-deploy s':>21}  {'ratio':>6}")
        for attempt, runtime, full, again in rows:
            print(f"{attempt:>3}  {runtime:<8} {full:>13.1f}  {again:>21.1f}  {again / full:>6.2f}")
        if len(runtimes) == 2:
            for attempt in range(1, args.repeat + 1):
                process, docker = (row for row in rows if row[0] == attempt)
                print(
                    f"run {attempt}: docker / process: full {docker[2] / process[2]:.1f}x, no-change {docker[3] / process[3]:.1f}x"
                )
        print(f"load average after: {os.getloadavg()[0]:.2f} (2 cores here: > 2 means the figures are inflated)")


if __name__ == "__main__":
    main()
