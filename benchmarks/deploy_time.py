"""How long `fab deploy` takes on the local target: a full deploy (after `make`), then a no-change re-deploy.

    .venv/bin/python benchmarks/deploy_time.py [--repeat 2]

Runs as an isolated user (own state file, deploy folder and free ports), so it
does not disturb a deployment you already have, and tears down at the end.
Prints each time and the ratio. The machine is noisy: compare within one run.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="full + no-change pairs to measure (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="deploy-time-") as folder:
        env = dict(os.environ, LAB_STATE_FILE=f"{folder}/state/state.json",
                   FABRIC_LAB_LOCAL_DEPLOY_DIR=f"{folder}/deploy")  # fmt: skip
        env.update({f"FABRIC_LAB_PORTS_{name.upper()}": str(port) for name, port in zip(PORTS, free_ports(len(PORTS)))})
        rows = []
        for attempt in range(1, args.repeat + 1):
            fab(env, "provision", "--target", "local")
            full = fab(env, "deploy")
            again = fab(env, "deploy")
            fab(env, "teardown")
            rows.append((attempt, full, again))
        print(f"{'run':>3}  {'full deploy s':>13}  {'no-change re-deploy s':>21}  {'ratio':>6}")
        for attempt, full, again in rows:
            print(f"{attempt:>3}  {full:>13.1f}  {again:>21.1f}  {again / full:>6.2f}")
        print(f"load average after: {os.getloadavg()[0]:.2f} (2 cores here: > 2 means the figures are inflated)")


if __name__ == "__main__":
    main()
