"""Faults while deploying and measuring, injected as they happen, on the local target with the process runtime:
nothing leaks and nothing is reported that was not measured.

- Triton killed (SIGKILL, as the OOM killer does) while perf_analyzer measures: the bench keeps
  what it measured, says which model failed and why, and one teardown ends everything, stubs included.
- Windows that never stabilise: bench and tune report "no stable measurement" with perf_analyzer's
  own words, never figures (how `fab run` ends after such a bench: tests/test_pipeline_stages.py).
- Two deploys at once: one waits for the other; --no-wait refuses. A deploy killed outright:
  the next command ends the Ansible run it left going.
After each, one `fab teardown` exits 0 and no process, port or shared-memory region of ours is left.
The unstable windows and the killed server share one deployment: the first only reads it, the
second (after it) kills its server and tears it down.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.lab import assert_nothing_of_ours_is_left, new_lab, our_processes

from provision.host.layout import run_dir
from provision.lock import playbook_processes

pytestmark = pytest.mark.deploy


def unstable_quick_profile(tmp_path: Path) -> list[str]:
    """`fab -f FILE`: a quick profile whose windows never agree (within 0.1 %, in 3 trials) on a real server."""
    settings = tmp_path / "unstable.yaml"
    settings.write_text("lab:\n  bench:\n    quick:\n      stability_percentage: 0.1\n      max_trials: 3\n")
    return ["-f", str(settings)]


def wait_for(condition, what: str, timeout_s: float = 600, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert process is None or process.poll() is None, f"the command ended before {what}:\n{process.stdout.read()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s"
        time.sleep(0.2)
    return found


def perf_analyzer_measures(model: str) -> bool:
    done = subprocess.run(["pgrep", "-f", f"perf_analyzer -m {model} "], capture_output=True)
    return done.returncode == 0


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """One local deployment for the two tests that measure on it, in this file's order: the no-stable-window
    test only reads it; the killed-server test then kills its server and proves that teardown ends the rest."""
    lab = new_lab(tmp_path_factory.mktemp("faults-lab"))
    lab.fab("provision", "--target", "local")
    lab.fab("deploy")
    yield lab
    if lab.state() is not None:  # the killed-server test failed before its teardown, or did not run
        lab.fab("teardown", "--purge", check=False)


@pytest.mark.xdist_group("faults-deployment")
def test_no_stable_window_is_reported_as_such_in_bench_and_tune_never_as_figures(deployed, tmp_path):
    lab, unstable = deployed, unstable_quick_profile(tmp_path)

    bench = lab.fab(*unstable, "bench", "--quick", "--model", "food_classifier")
    run = Path(re.search(r"^results: (\S+)$", bench.stdout, flags=re.MULTILINE).group(1))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["models"] == {} and summary["best"] is None, "nothing measured, nothing invented"
    assert summary["missing_levels"] == {"food_classifier": [2, 4]}
    report = (run / "report.md").read_text()
    assert re.search(
        r'Not measured: no stable measurement at concurrency 2, 4 \(perf_analyzer: "Failed to obtain stable '
        r"measurement within 3 measurement windows for concurrency 2",
        report,
    ), report
    for plot in ("throughput.png", "latency.png"):
        assert (run / plot).stat().st_size > 0

    # One concurrency and one batch size: every candidate fails the same way, so a small grid proves it.
    tune = lab.fab(
        *unstable, "tune", "--model", "batching_food_classifier", "--p99-ms", "10000", "--quick", "--repeats", "1",
        "--concurrency", "2:2:2", "--batch-sizes", "4", check=False,
    )  # fmt: skip
    assert tune.returncode == 1, tune.stdout + tune.stderr
    candidates = re.findall(r"^  candidate (\d+): (.*)$", tune.stdout, flags=re.MULTILINE)
    assert len(candidates) >= 2, tune.stdout
    for number, line in candidates:
        assert re.search(
            r'not measured: no stable measurement at concurrency 2 \(perf_analyzer: "Failed to obtain', line
        ), line
        assert "infer/s" not in line, f"candidate {number} was given figures: {line}"
    assert "no configuration of batching_food_classifier kept p99 within" in tune.stderr


@pytest.mark.xdist_group("faults-deployment")
def test_a_server_killed_during_the_bench_keeps_what_was_measured_and_teardown_ends_the_rest(deployed):
    lab, home = deployed, deployed.root / "deploy-local"
    earlier = set(lab.results_dir.glob("*"))  # the runs of the test before this one, on this deployment
    bench = lab.popen_fab("bench", "--quick", "--model", "food_classifier", "--model", "batching_food_classifier")
    try:
        # The first model's log, CSV and config are on the controller as soon as it is measured,
        # before the second model runs (the config comes last).
        pattern = "*/hosts/local/configs/food_classifier.pbtxt"
        first_config = wait_for(
            lambda: next((path for path in lab.results_dir.glob(pattern) if path.parents[3] not in earlier), None),
            "the first model's results",
            process=bench,
        )
        run = first_config.parents[3]
        assert (run / "hosts/local/food_classifier.csv").exists() and (run / "hosts/local/food_classifier.log").exists()
        wait_for(lambda: perf_analyzer_measures("batching_food_classifier"), "second measurement", process=bench)
        os.kill(int((run_dir(home) / "tritonserver.pid").read_text()), signal.SIGKILL)
        output = bench.communicate(timeout=600)[0]
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, output
    assert "the bench stopped: perf_analyzer failed on batching_food_classifier" in output
    assert (
        f"Triton stopped answering at http://127.0.0.1:{lab.ports['triton_http']} during batching_food_classifier"
        in output
    )
    assert f"the partial results are in {run} (PARTIAL.md)" in output

    summary = json.loads((run / "summary.json").read_text())
    assert "batching_food_classifier" in summary["partial"]["reason"]
    assert summary["partial"]["not_measured"] == ["batching_food_classifier"]
    assert list(summary["models"]) == ["food_classifier"], "what was measured is reported"
    assert "batching_food_classifier" in (run / "PARTIAL.md").read_text()
    assert "> **PARTIAL**" in (run / "report.md").read_text()
    assert (run / "hosts/local/batching_food_classifier.log").exists(), "the failed model's log is kept"

    # The python backend's stubs outlive a killed server, with their shared memory.
    assert our_processes(home), "nothing of the killed server is left: the test proves nothing"
    done = lab.fab("teardown", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_nothing_of_ours_is_left(lab, home)


def test_two_deploys_at_once_one_waits_for_the_other(lab, tmp_path):
    lab.fab("provision", "--target", "local")
    first, second = lab.popen_fab("deploy"), lab.popen_fab("deploy")
    try:
        outputs = [first.communicate(timeout=900)[0], second.communicate(timeout=900)[0]]
    finally:
        for deploy in (first, second):
            if deploy.poll() is None:
                deploy.kill()
    assert [first.returncode, second.returncode] == [0, 0], "\n".join(outputs)
    assert all("Traceback" not in output for output in outputs)
    waited = [output for output in outputs if "waiting for fab deploy (pid " in output]
    assert len(waited) == 1, "\n".join(outputs)
    assert "deploy complete" in waited[0]

    deploy = lab.popen_fab("deploy")
    try:
        wait_for(lambda: lock_holder(lab), "the deploy's lock", process=deploy)
        refused = lab.fab("teardown", "--no-wait", check=False)
        assert refused.returncode == 1
        assert re.search(r"error: fab deploy \(pid \d+, since [\d: -]+\) is working on this state", refused.stderr)
        assert lab.state() is not None and "stopping services" not in refused.stdout, "it did nothing"
    finally:
        deploy.communicate(timeout=900)
    assert deploy.returncode == 0
    done = lab.fab("teardown", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_nothing_of_ours_is_left(lab, tmp_path / "deploy-local")


def lock_holder(lab) -> dict | None:
    """Who holds the state's lock, as the lock file says (empty when it was released cleanly)."""
    path = lab.state_file.with_name(lab.state_file.name + ".lock")
    text = path.read_text().strip() if path.exists() else ""
    return json.loads(text) if text else None


def test_a_killed_deploy_leaves_no_ansible_run_going(lab, tmp_path):
    home = tmp_path / "deploy-local"
    lab.fab("provision", "--target", "local")
    deploy = lab.popen_fab("deploy")
    # Killed while a task waits on the host: the server is launched, its models load.
    wait_for(lambda: (run_dir(home) / "tritonserver.pid").exists(), "the server's start", process=deploy)
    os.kill(deploy.pid, signal.SIGKILL)  # fab alone: its Ansible run (in sessions of its own) goes on
    deploy.wait()
    mark = lock_holder(lab)["playbooks"][-1]  # the playbook run that was going
    assert playbook_processes(mark), "the run goes on without fab"

    again = lab.fab("deploy", check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"taking over the lock of fab deploy \(pid \d+, since [\d: -]+\): it ended without releasing it",
                     again.stderr)  # fmt: skip
    assert "ending the Ansible run it left going" in again.stderr
    assert playbook_processes(mark) == {}, "the old run is gone"
    assert "deploy complete" in again.stdout and lab.state()["deploy"]["status"] == "deployed"
    done = lab.fab("teardown", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_nothing_of_ours_is_left(lab, home)


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB tmpfs: too small for a deploy (the Triton wheel alone is larger). Unmounted after."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=False)


def test_a_full_disk_is_named_with_the_folder_and_its_free_space(lab, small_disk):
    home = small_disk / "deploy"
    lab.extra_env["FABRIC_LAB_LOCAL_DEPLOY_DIR"] = str(home)
    lab.fab("provision", "--target", "local")
    done = lab.fab("deploy", check=False)
    assert done.returncode == 1
    assert re.search(
        rf"the disk is full on local \(.*: No space left on device\): {home}: \d+\.\d MB free of 40\.0 MB "
        rf"\(the filesystem on {small_disk}\)",
        " ".join(done.stderr.split()),
    ), done.stderr
    teardown = lab.fab("teardown", check=False)
    assert teardown.returncode == 0, teardown.stdout + teardown.stderr
    assert_nothing_of_ours_is_left(lab, home)
