"""How long `fab deploy` takes on the local target: full, no-change, and a one-model config change.

    .venv/bin/python benchmarks/deploy_time.py [--repeat 2] [--runtime docker]

Each run: a full deploy (after `make`), a no-change re-deploy, then a deploy
whose only change is one model's config (multigpu_food_classifier's instance
count), which loads that model into the running server. Then, on the same
deployment, the two ways to apply such a change, side by side: loading the
one model through Triton's repository API, and restarting Triton until every
model is READY again.

Runs as an isolated user (own state file, deploy folder and free ports), so it
does not disturb a deployment you already have, and tears down at the end.
Prints each time and the ratio. The machine is noisy: compare within one run.

--runtime docker measures the process runtime and the docker runtime side by
side. The docker runtime's full deploy is cold: no image of ours and no build
cache (teardown removes the images, the builder cache is pruned before each
run); the base images stay, as a registry's would be cached on a node. It uses
the engine and stand-in bases of the tests (provision/docker_engine.py, `make
docker-bases`) unless FABRIC_LAB_DOCKER_ENGINE_HOST names another engine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAB = str(Path(sys.executable).parent / "fab")
sys.path.insert(0, str(ROOT))
from provision import docker_engine, runtimes  # noqa: E402
from provision import state as state_module  # noqa: E402
from provision.host.background import free_ports  # noqa: E402
from provision.model_repo import model_names  # noqa: E402

PORTS = ("triton_http", "triton_grpc", "triton_metrics", "api", "jupyter")


def fab(env: dict, *args: str) -> float:
    """Run `fab ARGS`; return its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run([FAB, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"fab {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def runtime_env(runtime: str, env: dict) -> dict:
    """The environment of a user of `runtime`: on a Docker engine, the project's own engine and stand-in
    bases (provision/docker_engine.py) unless FABRIC_LAB_DOCKER_ENGINE_HOST names another."""
    if not runtimes.uses_docker_engine(runtime) or env.get("FABRIC_LAB_DOCKER_ENGINE_HOST"):
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


CHANGED_MODEL = "multigpu_food_classifier"  # the only model lab.models.instances_per_gpu renders into


def triton_post(url: str, timeout: float = 600) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


def wait_all_ready(triton: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(f"{triton}/v2/repository/index", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:
                states = {entry["name"]: entry.get("state") for entry in json.loads(response.read())}
            if all(states.get(model) == "READY" for model in model_names()):
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"Triton at {triton} not READY after {timeout_s:.0f} s")


def load_one_model(triton: str) -> float:
    """Seconds to load CHANGED_MODEL again into the running server (what a config-only deploy does)."""
    started = time.perf_counter()
    triton_post(f"{triton}/v2/repository/models/{CHANGED_MODEL}/load")
    return time.perf_counter() - started


def host_helper(env: dict, subcommand: str) -> str:
    """What the deployed runtime's host-side helper prints for `subcommand` (restart triton, pids...):
    the runtime says how to run it (provision.runtimes.host_command)."""
    state = state_module.load(Path(env["LAB_STATE_FILE"]))
    deployed = state.deploy["hosts"][state.hosts[0].name]
    command = runtimes.host_command(state.runtime, deployed, subcommand)
    done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{command} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def restart_triton(env: dict, triton: str) -> float:
    """Seconds to restart Triton until every model is READY (what a config change cost before)."""
    started = time.perf_counter()
    host_helper(env, "restart triton")
    wait_all_ready(triton)
    return time.perf_counter() - started


# The runtime every run measures; --runtime adds another beside it.
BASELINE_RUNTIME = runtimes.RUNTIMES[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="full + no-change pairs to measure (default 2)")
    parser.add_argument("--runtime", choices=runtimes.RUNTIMES, default=BASELINE_RUNTIME,
                        help=f"measure this runtime beside {BASELINE_RUNTIME} (default: {BASELINE_RUNTIME} only)")  # fmt: skip
    args = parser.parse_args()
    measured = list(dict.fromkeys([BASELINE_RUNTIME, args.runtime]))
    with tempfile.TemporaryDirectory(prefix="deploy-time-") as folder:
        env = dict(os.environ, LAB_STATE_FILE=f"{folder}/state/state.json",
                   FABRIC_LAB_LOCAL_DEPLOY_DIR=f"{folder}/deploy")  # fmt: skip
        env.update({f"FABRIC_LAB_PORTS_{name.upper()}": str(port) for name, port in zip(PORTS, free_ports(len(PORTS)))})
        rows = []
        for attempt in range(1, args.repeat + 1):
            for runtime in measured:  # interleaved: both see the same machine load
                run_env = runtime_env(runtime, env)
                if runtimes.uses_docker_engine(runtime):
                    cold_start(run_env)
                fab(run_env, "provision", "--target", "local", "--runtime", runtime)
                full = fab(run_env, "deploy")
                again = fab(run_env, "deploy")
                config_change = fab(run_env | {"FABRIC_LAB_MODELS_INSTANCES_PER_GPU": "2"}, "deploy")
                triton = f"http://127.0.0.1:{run_env['FABRIC_LAB_PORTS_TRITON_HTTP']}"
                load = load_one_model(triton)
                restart = restart_triton(run_env, triton)
                fab(run_env, "teardown")
                rows.append((attempt, runtime, full, again, config_change, load, restart))
        print(f"{'run':>3}  {'runtime':<8} {'full deploy s':>13}  {'no-change re-deploy s':>21}  {'ratio':>6}"
              f"  {'config-change deploy s':>22}  {'load 1 model s':>14}  {'restart Triton s':>16}")  # fmt: skip
        for attempt, runtime, full, again, config_change, load, restart in rows:
            print(f"{attempt:>3}  {runtime:<8} {full:>13.1f}  {again:>21.1f}  {again / full:>6.2f}"
                  f"  {config_change:>22.1f}  {load:>14.1f}  {restart:>16.1f}")  # fmt: skip
        for attempt, runtime, *_, load, restart in rows:
            print(f"run {attempt} {runtime}: loading the changed model is {restart / load:.1f}x faster than a restart")
        if len(measured) == 2:
            for attempt in range(1, args.repeat + 1):
                base, other = (row for row in rows if row[0] == attempt)
                print(
                    f"run {attempt}: {other[1]} / {base[1]}: full {other[2] / base[2]:.1f}x, "
                    f"no-change {other[3] / base[3]:.1f}x"
                )
        print(f"load average after: {os.getloadavg()[0]:.2f} (2 cores here: > 2 means the figures are inflated)")


if __name__ == "__main__":
    main()
