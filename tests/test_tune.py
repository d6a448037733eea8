"""fab tune on the local target, for real: a deployed tritonserver 2.51, perf_analyzer 2.51, Ansible.

A quick tune of batching_food_classifier under a budget finds a configuration
that meets it when measured again, measures fewer configurations than the grid,
and leaves the deployment serving what it served; `fab deploy --models-from`
deploys the winner. A budget nothing meets fails, naming the closest three; Ctrl-C puts the deployed
configuration back.
Requests a tune cannot serve get one clear message each.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from support.lab import new_lab
from support.observing import printed_lines, read_until, the_rest
from support.serving import classify

from provision import sample_images

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("tune")]

MODEL = "batching_food_classifier"
IMAGE = sample_images.jpeg(seed=3)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    lab = new_lab(tmp_path_factory.mktemp("tune-lab"))
    lab.fab("provision", "--target", "local")
    lab.fab("deploy")
    yield lab
    lab.fab("teardown", "--purge", check=False)


def triton_url(lab) -> str:
    return f"http://127.0.0.1:{lab.ports['triton_http']}"


def served(lab, model: str = MODEL) -> dict:
    """What the running server has loaded for the model: max_batch_size, batching and instances."""
    with urllib.request.urlopen(f"{triton_url(lab)}/v2/models/{model}/config", timeout=10) as response:
        config = json.loads(response.read())
    return {
        "max_batch_size": config["max_batch_size"],
        "preferred_batch_size": config["dynamic_batching"].get("preferred_batch_size", []),
        "max_queue_delay_us": int(config["dynamic_batching"].get("max_queue_delay_microseconds", 0)),
        "instance_count": sum(group["count"] for group in config["instance_group"]),
    }


def deployed_file(lab) -> Path:
    return lab.root / "deploy-local" / "models" / MODEL / "config.pbtxt"


def tune_folder(output: str) -> Path:
    return Path(next(line for line in output.splitlines() if line.startswith("results: ")).split(": ", 1)[1])


def test_a_quick_tune_finds_a_configuration_within_the_budget_and_leaves_the_deployment_as_it_was(deployed):
    before, before_text = served(deployed), deployed_file(deployed).read_text()
    budget_ms = 2000
    # One measurement per candidate: the median of repeats is the not-recommended test's to prove.
    done = deployed.fab("tune", "--model", MODEL, "--p99-ms", str(budget_ms), "--quick", "--repeats", "1")
    folder = tune_folder(done.stdout)
    best = json.loads((folder / "best.json").read_text())

    assert best["model"] == MODEL and best["budget_p99_ms"] == budget_ms
    assert best["measured"]["p99_ms"] <= budget_ms and best["measured"]["throughput"] > 0
    if best["measured_again"]:  # the winner is not the deployed configuration: measured again beside it
        assert best["measured_again"]["best"]["p99_ms"] <= budget_ms
    assert best["configurations_measured"] < best["configurations_in_grid"], "a search, not the grid"
    rows = list(csv.DictReader((folder / "candidates.csv").open()))
    assert len(rows) == best["configurations_measured"] + (2 if best["measured_again"] else 0)
    assert {"instance_count", "max_batch_size", "preferred_batch_size", "max_queue_delay_us", "p99_ms"} <= set(rows[0])
    assert (folder / "pareto.png").stat().st_size > 0
    report = (folder.parent / "report.md").read_text()
    assert "## Tune" in report and f"of {best['configurations_in_grid']} configurations" in report

    # The deployment serves what it served before, from the same file.
    assert served(deployed) == before and deployed_file(deployed).read_text() == before_text
    client = triton_http.InferenceServerClient(triton_url(deployed).removeprefix("http://"))
    ((label, _),) = classify(client, MODEL, [IMAGE])
    assert label

    # The winner, deployed; then the plain deploy puts the template's defaults back.
    deployed.fab("deploy", "--models-from", str(folder / "best.json"))
    winner = {name: best["settings"][name] for name in before}
    winner["preferred_batch_size"] = winner["preferred_batch_size"] or [winner["max_batch_size"]]  # Triton's reading
    assert served(deployed) == winner
    deployed.fab("deploy")
    assert served(deployed) == before


def test_a_budget_no_configuration_meets_fails_naming_the_closest_three(deployed):
    before = served(deployed)
    done = deployed.fab(
        "tune", "--model", MODEL, "--p99-ms", "1", "--quick", "--concurrency", "1:1:1", "--repeats", "1", check=False
    )
    assert done.returncode == 1
    message = done.stdout + done.stderr
    assert f"no configuration of {MODEL} kept p99 within 1 ms" in message
    closest = message.split("The closest:\n", 1)[1].split("\nResults:", 1)[0].splitlines()
    assert len(closest) == 3 and all("p99" in line and "max_batch_size" in line for line in closest)
    assert served(deployed) == before


def test_ctrl_c_during_a_tune_puts_the_deployed_configuration_back(deployed):
    before, before_text = served(deployed), deployed_file(deployed).read_text()
    tune = deployed.popen_fab("tune", "--model", MODEL, "--p99-ms", "2000", "--quick", "--repeats", "1")
    try:
        lines = printed_lines(tune)
        # The third candidate's config is now being loaded or measured.
        output = read_until(lines, "candidate 2:", timeout_s=600)
        time.sleep(3)
        os.killpg(tune.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        output += the_rest(lines, timeout_s=300)
        assert tune.wait(timeout=60) == 130, output[-4000:]
    finally:
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGKILL)
            tune.wait()
    assert "putting the deployed configuration back" in output
    assert served(deployed) == before and deployed_file(deployed).read_text() == before_text
    assert "deploy complete: no changes" in deployed.fab("deploy").stdout
    # What it had measured is kept: each candidate in candidates.csv, the report marked partial.
    run = sorted(deployed.results_dir.glob("*-tune"))[-1]
    numbers = [row["candidate"] for row in csv.DictReader((run / "tune" / "candidates.csv").open())]
    assert numbers[:2] == ["1", "2"]
    assert "> **PARTIAL**: The tune stopped early (interrupted)" in (run / "report.md").read_text()
    assert "(deployed)" in (run / "report.md").read_text(), "the deployed configuration is marked"
    assert (run / "PARTIAL.md").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "resnet"], "--model resnet: no such model; the models are "),
        (["--model", "ensemble"], "ensemble has no serving settings of its own to tune"),
        (["--model", "food_classifier", "--batch-sizes", "4,8"], "food_classifier has no dynamic batching"),
        (["--model", MODEL, "--p99-ms", "0"], "--p99-ms 0: give a number greater than 0 (milliseconds)"),
    ],
)
def test_requests_a_tune_cannot_serve_get_one_clear_message(deployed, args, message):
    args = args if "--p99-ms" in args else [*args, "--p99-ms", "100"]
    done = deployed.fab("tune", *args, check=False)
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_tune_needs_a_deployment(tmp_path):
    lab = new_lab(tmp_path)
    lab.fab("provision", "--target", "local")
    try:
        done = lab.fab("tune", "--model", MODEL, "--p99-ms", "100", check=False)
        assert done.returncode == 1 and "nothing is deployed: run `fab deploy` first" in done.stderr
    finally:
        lab.fab("teardown", "--purge", check=False)


def test_a_winner_that_does_not_beat_the_deployed_configuration_when_measured_again_is_not_recommended(deployed):
    """Under the server scenario with a single rate to search (8 requests/s, well below what every
    candidate serves here, so perf_analyzer sends it on schedule), every candidate sustains what that
    rate sends: the search cannot tell them apart beyond the noise and settles on max_batch_size 4.
    Measured again beside the deployed configuration, 3 times each, it shows no lead beyond the noise:
    the tune says so and best.json holds the deployed settings, so deploying it changes nothing."""
    before, before_text = served(deployed), deployed_file(deployed).read_text()
    deployed.extra_env["FABRIC_LAB_BENCH_QUICK_REQUEST_RATE_RANGE"] = "8:8:1"
    try:
        done = deployed.fab(
            "tune", "--model", MODEL, "--p99-ms", "5000", "--quick", "--scenario", "server", "--batch-sizes", "4"
        )
    finally:
        del deployed.extra_env["FABRIC_LAB_BENCH_QUICK_REQUEST_RATE_RANGE"]
    folder = tune_folder(done.stdout)
    best = json.loads((folder / "best.json").read_text())

    assert "each candidate measured 3 times, its median kept" in done.stdout
    assert best["measurements_per_candidate"] == 3
    assert best["rejected"]["settings"]["max_batch_size"] == 4, "the search settled on another configuration"
    assert best["recommended"] is False and best["settings"] == best["deployed"]["settings"]
    assert best["settings"]["max_batch_size"] == before["max_batch_size"]
    again = best["measured_again"]
    assert again["best"]["request_rate"] == again["deployed"]["request_rate"] == 8
    assert again["best"]["median_of"] == again["deployed"]["median_of"] == 3
    assert len(again["best"]["spread"]) == len(again["deployed"]["spread"]) == 2
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("not recommended: "))
    assert re.search(r"did not beat the deployed configuration \([0-9.]+ requests/s sent and answered", verdict)
    assert "beyond the noise (by more than 5%, every measurement of it above every one of the deployed's)" in verdict
    assert "fab deploy --models-from" not in done.stdout
    rows = list(csv.DictReader((folder / "candidates.csv").open()))
    assert all(row["median_of"] == "3" and row["host_load_max"] and row["cores"] for row in rows)
    for number in {row["candidate"] for row in rows}:  # each candidate's three measurements, files of their own
        measured = folder / "measurements" / f"{int(number):02d}" / "hosts" / "local"
        assert sorted(path.name for path in measured.glob("*.csv")) == [f"{MODEL}-{k}.csv" for k in (1, 2, 3)]
    report = (folder.parent / "report.md").read_text()
    assert "Each candidate was measured 3 times back to back" in report
    assert "**Not recommended: measured again side by side" in report

    # The tune's answer is the deployed configuration: deploying it changes nothing.
    deployed.fab("deploy", "--models-from", str(folder / "best.json"))
    assert served(deployed) == before and deployed_file(deployed).read_text() == before_text
