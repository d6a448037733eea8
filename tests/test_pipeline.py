"""The whole pipeline for real, on the local target and on an ssh host (a real sshd on 127.0.0.1):

provision -> deploy -> deploy again (no changes) -> status, /classify through the API, tunnel
-> a config change is loaded, nothing restarted -> logs -> bench --quick -> results -> teardown
-> nothing of ours left -> teardown again. The local run is `make check`'s end-to-end run.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from food11 import FOOD11_LABELS
from support import notebooks
from support.lab import Lab, assert_nothing_of_ours_is_left, new_lab
from support.observing import (
    changed_tasks,
    http_status,
    only_model_touched,
    printed_lines,
    read_until,
    served_instance_counts,
    the_rest,
)
from support.serving import post_image

from provision import sample_images
from provision.config import PROJECT_ROOT
from provision.host.background import port_is_free
from provision.model_repo import model_names

# What `fab bench` measures without --model: every model but the conditional captioner (the ensemble serves it).
BENCH_MODELS = [
    "food_classifier",
    "gpu_food_classifier",
    "batching_food_classifier",
    "multigpu_food_classifier",
    "ensemble",
]
# On the ssh host the bench measures two of them: what is particular to an ssh host (the run made
# there and fetched) does not depend on how many models it measures; the local run measures all five.
SSH_BENCH_MODELS = ["food_classifier", "ensemble"]


def provision_args(target: str, sshd) -> list[str]:
    if target == "local":
        return ["provision", "--target", "local"]
    return [
        "provision", "--target", "ssh", "--host", "127.0.0.1", "--port", str(sshd.port), "--user", sshd.user,
        "--key", str(sshd.key), "--python", "/usr/bin/python3",
        # The host is this machine: reuse the project's environment instead of a second torch install.
        "--serving-venv", sys.prefix,
    ]  # fmt: skip


def check_perf_analyzer_by_hand(lab: Lab) -> None:
    """`fab perf`: the course's perf_analyzer line as typed (its -u, its base64 input.json) runs on the host."""
    photo, course_input = lab.root / "photo.jpg", lab.root / "input.json"
    photo.write_bytes(sample_images.jpeg(seed=3))
    subprocess.run(
        [sys.executable, "client_scripts/make_perf_input.py", str(photo), "-o", str(course_input), "--encoding",
         "base64"],
        cwd=PROJECT_ROOT, check=True,
    )  # fmt: skip
    done = lab.fab(
        "perf", f"perf_analyzer -u triton_server:8000 -m food_classifier --input-data {course_input} -b 1 "
        "--concurrency-range 1 --measurement-mode count_windows --measurement-request-count 4 "
        "--stability-percentage 999",  # a busy test machine: any window will do
    )  # fmt: skip
    assert f"-u 127.0.0.1:{lab.ports['triton_http']} -m food_classifier --input-data input.json" in done.stdout
    assert "Throughput:" in done.stdout and "infer/sec" in done.stdout, done.stdout


def assert_jupyter_needs_its_token(status: str) -> None:
    url = re.search(r"jupyter: healthy \(pid \d+\) (\S+)", status).group(1)
    assert url.startswith("http://127.0.0.1:") and "/lab?token=" in url
    base, token = url.split("/lab?token=")
    with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=10) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/api/status", timeout=10)
    assert refused.value.code == 403


TUNNELLED = ("triton_http", "api", "jupyter")  # the ports fab tunnel forwards


def free_offset(ports: list[int]) -> int:
    """An offset that moves `ports` to free ones (here the host is this machine: its ports are taken)."""
    for offset in random.sample(range(100, 4000), 100):
        if all(port + offset < 65536 and port_is_free(port + offset, "127.0.0.1") for port in ports):
            return offset
    raise AssertionError("no free ports for the tunnel")


def check_the_tunnel(lab: Lab) -> None:
    """fab tunnel: the host's services on free local ports, Jupyter with the host's token; Ctrl-C closes it."""
    offset = free_offset([lab.ports[name] for name in TUNNELLED])
    triton, api, jupyter = (f"http://127.0.0.1:{lab.ports[name] + offset}" for name in TUNNELLED)
    tunnel = lab.popen_fab("tunnel", "--offset", str(offset))
    try:
        lines = printed_lines(tunnel)
        output = read_until(lines, "jupyter:")
        assert f"triton:  {triton}/v2/health/ready" in output and f"api:     {api}/docs" in output
        token = re.search(rf"jupyter: {jupyter}/lab\?token=(\S+)", output).group(1)
        assert http_status(f"{triton}/v2/health/ready") == 200 and http_status(f"{api}/healthz") == 200
        assert http_status(f"{jupyter}/api/status?token={token}") == 200
        assert http_status(f"{jupyter}/api/status") == 403

        again = lab.fab("tunnel", "--offset", str(offset), check=False)
        assert again.returncode != 0 and f"{lab.ports['triton_http'] + offset} (triton)" in again.stderr
        assert "already in use" in again.stderr and "--offset" in again.stderr

        os.killpg(tunnel.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        assert tunnel.wait(timeout=15) == 0
        assert "tunnel closed" in the_rest(lines)
    finally:
        if tunnel.poll() is None:
            os.killpg(tunnel.pid, signal.SIGKILL)
            tunnel.wait()
    assert all(port_is_free(lab.ports[name] + offset, "127.0.0.1") for name in TUNNELLED), "the tunnel closed its ports"


def check_ssh_errors_stop_the_tunnel(lab: Lab) -> None:
    """ssh refusing to connect (here: the host key changed) ends fab tunnel with ssh's own words."""
    known_hosts = lab.state_file.with_name("known_hosts")
    genuine = known_hosts.read_text()
    impostor = lab.root / "impostor_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    port = lab.state()["hosts"][0]["port"]
    known_hosts.write_text(f"[127.0.0.1]:{port} {impostor.with_suffix('.pub').read_text()}")
    try:
        offset = free_offset([lab.ports[name] for name in TUNNELLED])
        refused = lab.fab("tunnel", "--offset", str(offset), check=False)
    finally:
        known_hosts.write_text(genuine)
    assert refused.returncode != 0 and "ssh exited (255) before the tunnel was up" in refused.stderr
    assert "Host key verification failed" in refused.stderr


def check_the_notebook_where_jupyter_runs(deploy_dir: Path, run: Path, status: str, out: Path) -> None:
    """profiling.ipynb executed by the deployed Jupyter's Python (nbconvert: nbclient), in the folder Jupyter
    serves and with its environment as the process runtime gave it: it opens the run benched on this host
    and profiles food_classifier against the deployed Triton."""
    pid = re.search(r"jupyter: healthy \(pid (\d+)\)", status).group(1)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    python = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    folder = deploy_dir / "client_scripts"
    done = subprocess.run(
        [python, "-m", *notebooks.NBCONVERT, "profiling.ipynb", "--output-dir", str(out)],
        cwd=folder, env={**env, "PROFILE_MODELS": "food_classifier"}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    text, images = notebooks.executed(out / "profiling.ipynb")
    assert f"opening {run}" in text, "the run benched on this host, found from Jupyter's folder"
    assert images >= 3, "the run's plots"
    assert f"profiling food_classifier at concurrency 1:2:1 against {env['TRITON_URL']}" in text
    assert "### food_classifier, profiled here" in text and "| concurrency | client send |" in text
    row = next(line for line in text.splitlines() if line.startswith("| food_classifier | "))
    assert int(row.split("|")[2]) > 0, "Triton counted the profile's requests"


def service_pids(lab: Lab) -> dict:
    status = lab.fab("status").stdout
    return {name: re.search(rf"{name}: .*?\(pid (\d+)\)", status).group(1) for name in ("tritonserver", "api")}


# The local run is also `make check`'s end-to-end run (the default target and runtime).
@pytest.mark.deploy
@pytest.mark.parametrize("target", [pytest.param("local", marks=pytest.mark.check), "ssh"])
def test_the_whole_pipeline(target, lab, tmp_path, sshd):
    deploy_dir = tmp_path / ("deploy-local" if target == "local" else "deploy-remote")

    provisioned = lab.fab(*provision_args(target, sshd)).stdout
    assert "next: fab deploy" in provisioned
    state = lab.state()
    assert state["target"] == target and len(state["hosts"]) == 1
    assert (lab.state_file.parent / "hosts.yml").exists(), "provision renders the inventory"

    first = lab.fab("deploy").stdout
    assert "Start tritonserver and wait until every model is READY" in first
    assert changed_tasks(first), "the first deploy changes the host"

    second = lab.fab("deploy").stdout
    assert "deploy complete: no changes" in second
    assert changed_tasks(second) == [], "nothing changed, so nothing may be reported as changed or restarted"

    status = lab.fab("status").stdout
    assert f"target: {target}" in status and "tritonserver: READY" in status and "api: healthy" in status
    for model in model_names():
        assert f"{model}: READY" in status
    before = service_pids(lab)
    assert_jupyter_needs_its_token(status)
    answer = post_image(f"http://127.0.0.1:{lab.ports['api']}/classify", sample_images.jpeg(seed=5))
    assert answer["label"] in FOOD11_LABELS and 0 <= answer["probability"] <= 1, "the API classifies through Triton"
    if target == "ssh":
        check_the_tunnel(lab)
        check_ssh_errors_stop_the_tunnel(lab)
    else:
        here = lab.fab("tunnel")  # information, not an error
        assert "the local target is this machine: the services are already at " in here.stdout
        assert f"http://127.0.0.1:{lab.ports['triton_http']}/v2/health/ready" in here.stdout
    check_perf_analyzer_by_hand(lab)
    # The client script finds the deployment (its moved ports) in the state, without --url.
    found = subprocess.run(
        [sys.executable, "client_scripts/classify.py", str(lab.root / "photo.jpg")], env=lab.env(), cwd=PROJECT_ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert found.returncode == 0 and found.stdout.split(": ")[1].split(" (")[0] in FOOD11_LABELS, found.stderr

    # A changed model config (here: the instance count of one variant) is loaded into the running
    # server: the model it touches is copied and loaded again, no other model, nothing restarted.
    lab.extra_env["FABRIC_LAB_MODELS_INSTANCES_PER_GPU"] = "2"
    third = changed_tasks(lab.fab("deploy").stdout)
    assert "Copy the models that changed (multigpu_food_classifier)" in third
    assert "Load the changed models (multigpu_food_classifier)" in third
    assert not [task for task in third if task.startswith("Restart")], third
    assert only_model_touched("multigpu_food_classifier", third), "the other models' configs did not change"
    assert service_pids(lab) == before
    triton = f"http://127.0.0.1:{lab.ports['triton_http']}"
    assert served_instance_counts(triton, "multigpu_food_classifier") == [2]
    status = lab.fab("status").stdout
    assert all(f"{model}: READY" in status for model in model_names()), status

    logs = lab.fab("logs", "--service", "triton", "--lines", "2000").stdout
    assert "SMOKE WEIGHTS" in logs, "the server log says the weights are smoke weights"
    assert "Uvicorn running" in lab.fab("logs", "--service", "api").stdout

    benched = BENCH_MODELS if target == "local" else SSH_BENCH_MODELS
    models = [] if target == "local" else [arg for model in benched for arg in ("--model", model)]
    bench = lab.fab("bench", "--quick", *models).stdout
    results = lab.results_dir / re.search(r"results: .*/([^/\s]+)\n", bench).group(1)
    summary = json.loads((results / "summary.json").read_text())
    assert sorted(summary["models"]) == sorted(benched)
    for model, rows in summary["models"].items():
        # perf_analyzer skips a level it cannot measure stably (a busy machine): the report says so.
        levels = [row["concurrency"] for row in rows]
        assert levels and levels == sorted(levels) and set(levels) <= {2, 4}, model
        assert summary["missing_levels"].get(model, []) == [c for c in (2, 4) if c not in levels]
        for row in rows:
            assert row["throughput"] > 0 and row["p50_us"] > 0 and row["p99_us"] >= row["p50_us"], (model, row)
    assert summary["smoke_weights"] is True and summary["best"]["model"] in benched
    host = next(iter(summary["hosts"].values()))
    assert host["facts"]["triton"]["version"] == "2.51.0" and host["facts"]["torch"]["version"]
    assert sorted(host["configs"]) == model_names(), "the model configs as deployed are kept"
    assert "max_pixels" in (results / "hosts" / summary["host"] / "configs" / "food_classifier.pbtxt").read_text()
    assert all(command.startswith("perf_analyzer -m ") for command in summary["commands"].values())
    report = (results / "report.md").read_text()
    assert "SMOKE WEIGHTS" in report and "Best configuration" in report and "| concurrency |" in report
    # perf_analyzer sent the image file's bytes, as the seed's clients do, and the report says so.
    assert summary["input_encoding"] == "raw" and "sent as the file's bytes" in report
    (entry,) = json.loads((results / "hosts" / summary["host"] / "input.json").read_text())["data"]
    assert base64.b64decode(entry["INPUT_IMAGE"]["b64"])[4:] == (results / "input.jpg").read_bytes()
    for plot in ("throughput.png", "latency.png"):
        assert (results / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A copy of the run stays on the host, where its notebook looks; on the local target the notebook runs
    # there top to bottom, in Jupyter's folder and environment, and profiles a model itself.
    copy = deploy_dir / "results" / results.name
    assert (copy / "summary.json").read_bytes() == (results / "summary.json").read_bytes()
    assert (copy / "report.md").exists() and (copy / "throughput.png").exists()
    if target == "local":
        check_the_notebook_where_jupyter_runs(deploy_dir, copy, status, tmp_path / "executed")
    # The report's command, pasted as it is: the same measurement again, by hand.
    pasted = re.search(r"again by hand, from the project folder: `fab perf ('perf_analyzer -m food_classifier [^`]+)`",
                       report).group(1)  # fmt: skip
    again = lab.fab("perf", *shlex.split(pasted), timeout=300).stdout
    assert "Throughput:" in again and "infer/sec" in again, again

    token = re.search(r"lab\?token=(\S+)", status).group(1)
    written = [deploy_dir / "run", lab.state_file.parent, results]
    assert not [p for folder in written for p in folder.rglob("*") if p.is_file() and p.name != "jupyter.token"
                and token.encode() in p.read_bytes()], "the Jupyter token leaked into a log, the state or the results"  # fmt: skip

    torn_down = lab.fab("teardown").stdout
    assert "teardown complete" in torn_down
    assert_nothing_of_ours_is_left(lab, deploy_dir)
    assert not (lab.state_file.parent / "hosts.yml").exists()
    assert (results / "summary.json").exists(), "teardown keeps the results"
    assert "nothing to tear down" in lab.fab("teardown").stdout, "teardown is safe to run twice"


def test_fab_ssh_opens_a_shell_on_the_host(lab, sshd):
    lab.fab(*provision_args("ssh", sshd))
    shell = lab.fab("ssh", stdin="echo hello from $(whoami)@$(hostname)\n")
    assert f"hello from {sshd.user}@" in shell.stdout
    local = new_lab(lab.root / "other")
    local.fab("provision", "--target", "local")
    refused = local.fab("ssh", check=False)
    assert refused.returncode != 0 and "no SSH needed" in refused.stderr
    local.fab("teardown")
