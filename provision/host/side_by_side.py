"""Run a program several times side by side, group after group, and say how much CPU each run used.

    python3 -m provision.host.side_by_side --program perf_analyzer --plan plan.json --report report.json

plan.json: [{"name": "food_classifier-c2", "runs": [[args...], [args...]]}, ...]. The runs of
a group start together and the group ends when the last one does; then the next group
starts. Each run's output goes to <name>-<k>.log (k from 1) in the current folder.
report.json: [{"name", "wall_s", "load", "runs": [{"rc", "cpu_s"}]}], load being the host's 1-minute
load average as the group ended and its cores ({"load_average", "cores"}), cpu_s the run's own user
plus system CPU time (os.wait4): a client whose cpu_s is close to wall_s kept a core busy
and may have been the bottleneck (`fab bench --cluster` runs its perf_analyzer clients so).

Standard library only: it runs on hosts that have nothing of ours installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path


def run_group(program: str, name: str, runs: list[list[str]], folder: Path) -> dict:
    started = time.monotonic()
    processes = {}
    for number, args in enumerate(runs, start=1):
        with open(folder / f"{name}-{number}.log", "wb") as log:
            process = subprocess.Popen([program, *args], stdout=log, stderr=subprocess.STDOUT, cwd=folder)
        processes[process.pid] = number
    finished: dict[int, dict] = {}
    while len(finished) < len(processes):
        pid, status, usage = os.wait4(-1, 0)
        if pid in processes:
            finished[processes[pid]] = {
                "rc": os.waitstatus_to_exitcode(status),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            }
    return {
        "name": name,
        "wall_s": round(time.monotonic() - started, 3),
        "load": host_load(),
        "runs": [finished[number] for number in sorted(finished)],
    }


def host_load() -> dict:
    """The host's 1-minute load average now and the cores this process may use (as bench.yml records them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"load_average": round(os.getloadavg()[0], 2), "cores": cores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--program", required=True)
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    options = parser.parse_args()
    plan = json.loads(options.plan.read_text())
    folder = Path.cwd()
    report = [run_group(options.program, group["name"], group["runs"], folder) for group in plan]
    options.report.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"groups": len(report), "failed": sum(r["rc"] != 0 for g in report for r in g["runs"])}))


if __name__ == "__main__":
    main()
