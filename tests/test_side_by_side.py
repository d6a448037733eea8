"""provision.host.side_by_side: a group's runs start together; each run's exit status and own CPU time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import provision

PACKAGE_ROOT = Path(provision.__file__).resolve().parent.parent

BUSY = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\nprint('done')"


def test_runs_of_a_group_go_side_by_side_and_report_their_own_cpu_time(tmp_path):
    plan = [
        {"name": "busy", "runs": [["-c", BUSY], ["-c", BUSY]]},
        {"name": "idle-and-failing", "runs": [["-c", "import time; time.sleep(0.3)"], ["-c", "raise SystemExit(3)"]]},
    ]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    subprocess.run(
        [sys.executable, "-m", "provision.host.side_by_side", "--program", sys.executable,
         "--plan", "plan.json", "--report", "report.json"],
        cwd=tmp_path, check=True, env={"PYTHONPATH": str(PACKAGE_ROOT)},
    )  # fmt: skip
    busy, idle = json.loads((tmp_path / "report.json").read_text())
    assert [run["rc"] for run in busy["runs"]] == [0, 0]
    assert all(0.35 <= run["cpu_s"] <= busy["wall_s"] + 0.1 for run in busy["runs"])
    assert [run["rc"] for run in idle["runs"]] == [0, 3]
    assert idle["runs"][0]["cpu_s"] < 0.2  # sleeping costs no CPU
    assert (tmp_path / "busy-1.log").read_text() == "done\n" and (tmp_path / "busy-2.log").exists()
    # Each group records the host's load as it ended, as bench.yml does for a measurement.
    assert busy["load"]["cores"] == len(os.sched_getaffinity(0)) and busy["load"]["load_average"] >= 0
