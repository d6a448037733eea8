"""The host's load is recorded with every measurement; one taken under a load average above the
host's cores is flagged in the report and in `fab compare`.

bench.yml prints the load as each measurement ends (tests/test_bench_retry.py runs that line);
here runs are written as `fab bench` writes them, with perf_analyzer's recorded CSV and logs
that end as bench.yml's do, one measured at a load of 0.4 on 2 cores and one at 3.5.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from support.lab import new_lab

from provision.perf import measurement_stamp
from provision.report import write_report

MODEL = "batching_food_classifier"
RECORDED = Path(__file__).parent / "data" / "perf_analyzer_cpu_collect_metrics.csv"
QUIET, BUSY = "20261201-120000-local", "20261202-120000-local"


def bench_run(root: Path, run_id: str, load: float, throughput_scale: float = 1.0) -> dict:
    """A run of MODEL whose measurement ended at `load` on 2 cores (its throughput scaled)."""
    host = root / run_id / "hosts" / "local"
    (host / "configs").mkdir(parents=True)
    (host / "configs" / f"{MODEL}.pbtxt").write_text(f'name: "{MODEL}"\n')
    (host / "host.json").write_text(json.dumps({"cpu": {"model": "test CPU", "cores": 2}, "gpus": []}))
    with RECORDED.open() as recorded, (host / f"{MODEL}.csv").open("w", newline="") as written:
        reader = csv.DictReader(recorded)
        writer = csv.DictWriter(written, reader.fieldnames)
        writer.writeheader()
        for row in reader:
            writer.writerow({**row, "Inferences/Second": float(row["Inferences/Second"]) * throughput_scale})
    (host / f"{MODEL}.log").write_text(
        "*** Measurement Settings ***\n"
        f"host load: 1-minute load average {load} on 2 cores\n"
        f"{measurement_stamp(f'{run_id}/{MODEL}', f'{MODEL}.csv')}\n"
    )
    profile = {"name": "quick", "concurrency_range": "2:6:2", "measurement_mode": "count_windows",
               "measurement_request_count": 20, "measurement_interval_ms": 2000}  # fmt: skip
    return write_report(
        root / run_id, run_id=run_id, target="local", profile=profile, commands={MODEL: "perf_analyzer ..."},
        smoke_weights=True, git={"commit": None, "dirty": False},
    )  # fmt: skip


def test_the_load_of_every_measurement_is_in_the_summary_and_the_report(tmp_path):
    summary = bench_run(tmp_path, QUIET, 0.4)
    assert summary["hosts"]["local"]["load"] == {MODEL: {"load_average": 0.4, "cores": 2}}
    report = (tmp_path / QUIET / "report.md").read_text()
    assert "Host load as the measurement ended: load average 0.40 on 2 cores." in report
    assert "BUSY HOST" not in report


def test_a_measurement_under_a_load_above_the_cores_is_flagged_in_the_report(tmp_path):
    bench_run(tmp_path, BUSY, 3.5)
    report = (tmp_path / BUSY / "report.md").read_text()
    assert f"> **BUSY HOST**: measured under a load average above the host's cores: {MODEL} (load average 3.50 on 2 cores)" in report
    assert "load average 3.50 on 2 cores (**busy**: above its cores, the figures may be low)." in report


def test_a_load_equal_to_the_cores_is_not_flagged(tmp_path):
    bench_run(tmp_path, QUIET, 2.0)
    assert "BUSY HOST" not in (tmp_path / QUIET / "report.md").read_text()


def test_a_run_from_before_the_load_was_recorded_reads_as_before(tmp_path):
    bench_run(tmp_path, QUIET, 0.4)
    summary_file = tmp_path / QUIET / "summary.json"
    summary = json.loads(summary_file.read_text())
    for host in summary["hosts"].values():
        del host["load"]
    summary_file.write_text(json.dumps(summary))
    lab = new_lab(tmp_path / "lab")
    lab.extra_env["FABRIC_LAB_RESULTS_DIR"] = str(tmp_path)
    shutil.copytree(tmp_path / QUIET, tmp_path / BUSY)
    done = lab.fab("compare", QUIET, BUSY)
    assert "BUSY HOST" not in done.stdout


def test_fab_compare_flags_a_run_measured_on_a_busy_host_and_its_regressions(tmp_path):
    bench_run(tmp_path, QUIET, 0.4)
    bench_run(tmp_path, BUSY, 3.5, throughput_scale=0.5)
    lab = new_lab(tmp_path / "lab")
    lab.extra_env["FABRIC_LAB_RESULTS_DIR"] = str(tmp_path)
    done = lab.fab("compare", QUIET, BUSY)

    assert f"BUSY HOST {BUSY}: {MODEL} on local measured under load average 3.50 on 2 cores" in done.stdout
    regressions = [line for line in done.stdout.splitlines() if line.startswith("REGRESSION")]
    assert regressions and all("(measured on a busy host: may be the load)" in line for line in regressions)
    report = (tmp_path / "compare" / f"{QUIET}_vs_{BUSY}" / "compare.md").read_text()
    assert f"> **BUSY HOST**: measured under a load average above the host's cores: B: {MODEL} on local" in report
    assert "| **yes**: may be the load |" in report
