"""`fab run`: provision -> deploy -> bench -> teardown in one command, with teardown guaranteed.

On the local target: a run that succeeds, one whose deploy refuses what it was
given, and one interrupted (SIGINT) during the bench, with a second SIGINT
during its teardown. Each ends with nothing of ours running or listening and
the state cleared; the failures exit non-zero and name their stage. A user's
mistake found before anything starts (a weights file that is not there) is one
line and makes nothing. How a run ends after a bug in a stage is
tests/test_pipeline_stages.py's, with stand-in stages.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from support.lab import assert_nothing_of_ours_is_left
from support.observing import printed_lines, read_until, the_rest

pytestmark = pytest.mark.deploy


def test_a_run_provisions_deploys_benchmarks_and_tears_down(lab, tmp_path):
    done = lab.fab("run", "--target", "local", "--quick", "--model", "food_classifier", timeout=1200)
    stages = re.findall(r"^== fab run: (\w+)$", done.stdout, flags=re.MULTILINE)
    assert stages == ["provision", "deploy", "bench", "teardown"]
    results = re.search(r"fab run: results in (\S+)", done.stdout).group(1)
    assert os.path.exists(f"{results}/summary.json") and os.path.exists(f"{results}/report.md")
    assert done.stdout.rstrip().endswith("fab run: done; the deployment was torn down")
    assert_nothing_of_ours_is_left(lab, tmp_path / "deploy-local")


def test_a_missing_weights_file_is_refused_before_anything_starts(lab, tmp_path):
    missing = tmp_path / "no-such-food11.pth"
    lab.extra_env["FABRIC_LAB_FOOD11_WEIGHTS"] = str(missing)
    done = lab.fab("run", "--target", "local", "--quick", check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: lab.food11_weights (FABRIC_LAB_FOOD11_WEIGHTS) is {missing}: no such file"
    assert "== fab run" not in done.stdout, "no stage started"
    assert lab.state() is None


def test_a_run_takes_deploy_s_cluster_flags_and_deploy_judges_them(lab, tmp_path):
    # --cluster and --lb-node reach `fab deploy`, which refuses a balancer node of its own on
    # this one host before any host is touched (tests/test_cluster.py runs real clusters).
    done = lab.fab("run", "--target", "local", "--quick", "--cluster", "--lb-node", "0", check=False, timeout=600)
    assert done.returncode != 0 and "fab run: failed at deploy" in done.stdout
    assert "--lb-node local: a node of its own for the balancer leaves no host to serve" in done.stderr
    assert "fab run: the deployment was torn down" in done.stdout
    assert_nothing_of_ours_is_left(lab, tmp_path / "deploy-local")


def test_sigint_during_the_bench_tears_down_and_keeps_the_partial_results(lab, tmp_path):
    run = lab.popen_fab("run", "--target", "local", "--quick")
    try:
        lines = printed_lines(run)
        output = read_until(lines, "== fab run: bench", timeout_s=600)
        time.sleep(5)  # perf_analyzer is measuring
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        output += read_until(lines, "== fab run: teardown", timeout_s=120)
        os.killpg(run.pid, signal.SIGINT)  # a second Ctrl-C: refused, teardown finishes
        output += the_rest(lines, timeout_s=300)
        assert run.wait(timeout=60) == 130, output[-4000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert "fab run: teardown is finishing; it is not interrupted" in output
    assert "fab run: failed at bench: interrupted (Ctrl-C or SIGTERM)" in output
    assert "fab run: the deployment was torn down" in output
    partial = re.search(r"fab run: partial results in (\S+) \(PARTIAL\.md\)", output).group(1)
    # The bench itself wrote the report of what it measured, marked partial with its reason.
    assert "The bench stopped early (interrupted (Ctrl-C or SIGTERM))" in open(f"{partial}/PARTIAL.md").read()
    assert json.loads(open(f"{partial}/summary.json").read())["partial"]["reason"] == "interrupted (Ctrl-C or SIGTERM)"
    assert_nothing_of_ours_is_left(lab, tmp_path / "deploy-local")


def test_a_run_refuses_to_start_where_something_is_provisioned(lab, tmp_path):
    lab.fab("provision", "--target", "local")
    refused = lab.fab("run", "--target", "local", check=False)
    assert refused.returncode != 0 and "run `fab teardown` first" in refused.stderr
    assert lab.state() is not None, "what was there is left as it was"
    lab.fab("teardown")
