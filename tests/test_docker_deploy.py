"""The docker runtime for real, on the local target: images built, containers serving, bench, teardown.

A real dockerd of the tests' own and stand-ins for the two base images
(provision/docker_engine.py: no registry can be reached; `make docker-bases`
prepares both), selected by configuration only. The host has no GPU, so the
deployment is the one every CPU host gets: CPU images, CPU model instances.

provision --runtime docker -> deploy (all four roles, both images built) -> every model READY
-> /classify through the API container -> Jupyter with and without its token -> status, logs
-> bench --quick from inside the API container -> deploy again (no change, no restart)
-> a changed model config restarts the Triton container only -> teardown: no container or network
of ours left, the images kept as asked (built once per run: the cluster test below uses them).
A cluster on the docker runtime: deploy --cluster over SSH -> HAProxy in front of the Triton
container -> inferences through it over HTTP and gRPC -> bench --cluster's clients in a
container of the API image on the host's network -> the Triton container stopped: status
says DOWN -> teardown: no balancer, nothing of ours left, the images removed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from food11 import FOOD11_LABELS
from support import notebooks
from support.lab import assert_nothing_of_ours_is_left
from support.observing import changed_tasks, http_status, only_model_touched, served_instance_counts
from support.serving import APIS, classify, inference_count, post_image, status_once

from provision import docker_engine, sample_images
from provision.host.background import port_is_free
from provision.host.tritonserver import perf_analyzer_env
from provision.model_repo import model_names
from provision.perf import write_input_json

# One worker runs them all (pytest-xdist's loadgroup): they share the engine and the Compose project name.
pytestmark = [pytest.mark.docker, pytest.mark.deploy, pytest.mark.xdist_group("docker")]

PROJECT = "triton-lab-test"


@pytest.fixture(scope="module")
def engine():
    """The tests' dockerd with the stand-in bases (built once; `make docker-bases` does it beforehand)."""
    docker_engine.install()
    docker_engine.start()
    docker_engine.bases()
    return docker_engine


def docker(*args: str) -> str:
    return docker_engine.docker(*args, capture_output=True).stdout.strip()


def wait_healthy(container: str, timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while (health := docker("inspect", "--format", "{{.State.Health.Status}}", container)) == "starting":
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    return health


def started_at(container: str) -> str:
    return docker("inspect", "--format", "{{.State.StartedAt}}", container)


def ours() -> dict[str, list[str]]:
    """What of the test project is in the engine: containers, networks, images."""
    label = f"label=com.docker.compose.project={PROJECT}"
    return {
        "containers": docker("ps", "--all", "--quiet", "--filter", label).split(),
        "networks": docker("network", "ls", "--quiet", "--filter", f"name=^{PROJECT}$").split(),
        "images": docker("images", "--quiet", f"{PROJECT}/*").split(),
    }


def notebook_in_the_jupyter_container(container: str) -> str:
    """profiling.ipynb executed in the API and Jupyter container, as Jupyter would run it there: what it showed."""
    docker(
        "exec", "--env", "PROFILE_MODELS=food_classifier", "--workdir", "/app/client_scripts", container,
        *notebooks.NBCONVERT, "profiling.ipynb", "--output-dir", "/tmp/executed",
    )  # fmt: skip
    text, _ = notebooks.outputs(json.loads(docker("exec", container, "cat", "/tmp/executed/profiling.ipynb")))
    return text


# The whole life of a docker deployment in one test (builds, deploys, bench, tune, three more deploys):
# longer than the suite's 900 s on a machine that runs the other tests beside it.
@pytest.mark.timeout(2400)
def test_the_docker_runtime_builds_serves_benchmarks_and_tears_down(engine, lab, tmp_path):
    # Its images are kept at teardown (lab.docker.remove_images false) for the cluster test below, whose
    # teardown removes them: the images are built once per run, and their removal is tested once.
    lab.extra_env.update(
        engine.settings() | {"FABRIC_LAB_DOCKER_PROJECT": PROJECT, "FABRIC_LAB_DOCKER_REMOVE_IMAGES": "false"}
    )
    assert "DOCKER_HOST" not in lab.env(), "the engine is chosen by configuration, not by the caller's environment"
    if left := ours()["images"]:  # an earlier run's, stopped before its teardown: this test builds its own
        docker("image", "rm", "--force", *left)
    deploy_dir = tmp_path / "deploy-local"

    lab.fab("provision", "--target", "local", "--runtime", "docker")
    assert lab.state()["runtime"] == "docker"

    first = lab.fab("deploy", timeout=2400).stdout
    assert "no GPU: CPU images" in first, "the preflight says what the host gets"
    assert "NVIDIA container toolkit skipped: no GPU on this host" in first
    built = [line for line in changed_tasks(first) if line.startswith("Build the missing images")]
    assert len(built) == 2, f"both images are built:\n{first}"
    assert "Start the containers (recreates those whose definition or image changed)" in changed_tasks(first)
    assert "Restart the Triton container" not in changed_tasks(first), "a container just started has read the weights"
    triton, api = f"{PROJECT}-triton-1", f"{PROJECT}-api-1"
    # Docker runs the image's health check every 15 s: it agrees with the deploy's readiness wait soon after.
    assert wait_healthy(triton) == "healthy"

    # The API container reaches Triton by its service name; the models run as CPU instances.
    status = lab.fab("status").stdout
    assert "tritonserver: READY" in status and "api: healthy" in status and f"(container {triton} running)" in status
    for model in model_names():
        assert f"{model}: READY" in status
    api_url = f"http://127.0.0.1:{lab.ports['api']}"
    answer = post_image(f"{api_url}/classify", sample_images.jpeg())
    assert answer["label"] and 0 <= answer["probability"] <= 1
    triton_url = f"http://127.0.0.1:{lab.ports['triton_http']}"
    with urllib.request.urlopen(f"{triton_url}/v2/models/gpu_food_classifier/config", timeout=10) as response:
        config = json.loads(response.read())
    assert [group["kind"] for group in config["instance_group"]] == ["KIND_CPU"]
    assert "cpu_fallback" in json.dumps(config.get("parameters", {})), "labelled as the process runtime labels it"

    jupyter = re.search(r"jupyter: healthy \(container \S+ running\) (\S+)", status).group(1)
    base, token = jupyter.split("/lab?token=")
    assert http_status(f"{base}/api/status?token={token}") == 200 and http_status(f"{base}/api/status") == 403

    assert "SMOKE WEIGHTS" in lab.fab("logs", "--service", "triton", "--lines", "2000").stdout
    assert "Uvicorn running" in lab.fab("logs", "--service", "api", "--lines", "200").stdout

    # perf_analyzer inside the API container, against the Triton container; results come back.
    # Two models (one alone, the ensemble that calls others): what is the docker runtime's here is where
    # perf_analyzer runs and how the run comes back, not how many models it measures.
    bench = lab.fab("bench", "--quick", "--model", "food_classifier", "--model", "ensemble", timeout=1800).stdout
    results = lab.results_dir / re.search(r"results: .*/([^/\s]+)\n", bench).group(1)
    summary = json.loads((results / "summary.json").read_text())
    assert sorted(summary["models"]) == ["ensemble", "food_classifier"]
    assert all(row["throughput"] > 0 for rows in summary["models"].values() for row in rows)
    assert all(f"-u triton:{lab.ports['triton_http']}" in command for command in summary["commands"].values())
    assert (results / "report.md").exists()
    # A copy of the run is on the host, in the folder the Jupyter container mounts: the notebook, executed
    # there top to bottom (nbconvert: nbclient), opens it and profiles a model itself against Triton's container.
    assert (deploy_dir / "results" / results.name / "summary.json").exists()
    text = notebook_in_the_jupyter_container(api)
    assert f"opening /app/results/{results.name}" in text
    assert f"profiling food_classifier at concurrency 1:2:1 against triton:{lab.ports['triton_http']}" in text
    assert "### food_classifier, profiled here" in text and "| concurrency | client send |" in text
    row = next(line for line in text.splitlines() if line.startswith("| food_classifier | "))
    assert int(row.split("|")[2]) > 0, "Triton counted the profile's requests"

    # Nothing changed: nothing reported, no image built, no container restarted.
    before = {name: started_at(name) for name in (triton, api)}
    second = lab.fab("deploy").stdout
    assert "deploy complete: no changes" in second and changed_tasks(second) == []
    assert {name: started_at(name) for name in (triton, api)} == before

    # fab tune loads its candidates into the running Triton container and puts the deployed config back:
    # nothing restarted, and a deploy afterwards finds nothing to change.
    tuned = lab.fab(
        "tune", "--model", "batching_food_classifier", "--p99-ms", "5000", "--quick", "--concurrency", "2:2:2",
        "--batch-sizes", "8", "--repeats", "1", timeout=1800,
    ).stdout  # fmt: skip
    best = json.loads((Path(re.search(r"results: (\S+)\n", tuned).group(1)) / "best.json").read_text())
    assert best["runtime"] == "docker" and best["measured"]["p99_ms"] <= 5000
    assert best["configurations_measured"] < best["configurations_in_grid"]
    assert {name: started_at(name) for name in (triton, api)} == before
    assert "deploy complete: no changes" in lab.fab("deploy").stdout

    # A changed model config is loaded into the running Triton container: no restart, no build.
    lab.extra_env["FABRIC_LAB_MODELS_INSTANCES_PER_GPU"] = "2"
    third = changed_tasks(lab.fab("deploy").stdout)
    assert "Copy the models that changed (multigpu_food_classifier)" in third
    assert "Load the changed models (multigpu_food_classifier)" in third
    assert not [line for line in third if line.startswith(("Restart", "Build", "Start"))], third
    assert only_model_touched("multigpu_food_classifier", third), "the other models' configs did not change"
    assert {name: started_at(name) for name in (triton, api)} == before
    assert served_instance_counts(triton_url, "multigpu_food_classifier") == [2]

    images = ours()["images"]
    assert len(images) == 2, "the images deploy built are there until teardown"
    torn_down = lab.fab("teardown").stdout
    assert "teardown complete" in torn_down
    assert ours() == {"containers": [], "networks": [], "images": images}, (
        "teardown leaves no container or network of ours in the engine, and the images, as asked"
    )
    assert_nothing_of_ours_is_left(lab, deploy_dir)
    assert docker("image", "inspect", "--format", "ok", engine.TRITON_STANDIN) == "ok", "the base images stay cached"
    assert os.path.exists(results / "summary.json"), "teardown keeps the results"


def test_a_cluster_on_the_docker_runtime_balances_its_containers_and_benchmarks_through_the_balancer(
    engine, lab, sshd, triton_runtime, tmp_path
):
    # One node, this machine over SSH: the docker-specific parts of a cluster (the Triton container
    # published where the balancer reaches it, the bench's clients on the host's network) on the
    # tests' one engine; several nodes are tests/test_cluster.py's, on the process runtime.
    lab.extra_env.update(engine.settings() | {"FABRIC_LAB_DOCKER_PROJECT": PROJECT})
    lab.fab(
        "provision", "--target", "ssh", "--runtime", "docker", "--host", "127.0.0.1", "--port", str(sshd.port),
        "--user", sshd.user, "--key", str(sshd.key), "--python", "/usr/bin/python3",
    )  # fmt: skip
    node = lab.state()["hosts"][0]["name"]
    lab.fab("deploy", "--cluster", timeout=2400)
    status = status_once(lab, [f"  {api} backends: {node} UP\n" for api in APIS])
    assert f"balancer: haproxy on {node}" in status, status

    through = triton_http.InferenceServerClient(f"127.0.0.1:{lab.ports['balancer_http']}")
    assert classify(through, "food_classifier", [sample_images.jpeg()])[0][0] in FOOD11_LABELS
    # gRPC through the balancer too (HTTP/2 to the container's gRPC port), with perf_analyzer's gRPC client.
    served = f"127.0.0.1:{lab.ports['triton_http']}"  # the Triton container itself
    before = inference_count(served, "food_classifier")
    grpc = subprocess.run(
        [str(Path(sys.executable).parent / "perf_analyzer"), "-m", "food_classifier", "-i", "grpc",
         "-u", f"127.0.0.1:{lab.ports['balancer_grpc']}", "--input-data",
         str(write_input_json(tmp_path / "input.json", [sample_images.jpeg()])), "--concurrency-range", "1:1",
         "--measurement-mode", "count_windows", "--measurement-request-count", "5", "--max-trials", "3",
         "--stability-percentage", "100"],
        capture_output=True, text=True, timeout=300, env=perf_analyzer_env(triton_runtime.root),
    )  # fmt: skip
    assert grpc.returncode == 0 and "Throughput:" in grpc.stdout, grpc.stdout + grpc.stderr
    after = inference_count(served, "food_classifier")
    assert after >= before + 5, (before, after)

    bench = lab.fab("bench", "--cluster", "--quick", "--model", "food_classifier", timeout=1800).stdout
    results = lab.results_dir / re.search(r"results: .*/([^/\s]+)\n", bench).group(1)
    assert "## Cluster: 1 node behind one balancer" in (results / "report.md").read_text()
    levels = json.loads((results / "summary.json").read_text())["cluster"]["models"]["food_classifier"]["levels"]
    assert levels and all(row["throughput"] > 0 and row["nodes_alone"][node] > 0 for row in levels), levels
    assert not docker("ps", "--all", "--quiet", "--filter", "label=com.docker.compose.service=clients"), (
        "the clients' container is gone after the run"
    )

    # The Triton container stops: the balancer's health check takes it out, and status says so.
    docker("stop", f"{PROJECT}-triton-1")
    status_once(lab, [f"  triton_http backends: {node} DOWN\n"])

    # Teardown removes the images by default (lab.docker.remove_images): those the test above kept too.
    lab.fab("teardown")
    assert ours() == {"containers": [], "networks": [], "images": []}, "teardown leaves nothing of ours in the engine"
    assert subprocess.run(["pgrep", "-f", f"haproxy.*{lab.root}"], capture_output=True).stdout == b""
    assert all(port_is_free(port, "127.0.0.1") for port in lab.ports.values())


def test_a_failed_build_names_the_failing_step_and_its_log_and_teardown_cleans_up(engine, lab, tmp_path):
    # A base image that is not there and cannot be pulled (no registry answers here).
    missing = "triton-lab-standin/no-such-base:1"
    lab.extra_env.update(
        engine.settings() | {"FABRIC_LAB_DOCKER_PROJECT": PROJECT, "FABRIC_LAB_DOCKER_TRITON_IMAGE": missing}
    )
    lab.fab("provision", "--target", "local", "--runtime", "docker")
    failed = lab.fab("deploy", check=False, timeout=1200)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert f"the wheels of {PROJECT}/triton:" in output and f"could not be downloaded (pip in {missing}" in output
    assert re.search(r"full log: \S+/run/build-triton\.log", output), output
    assert lab.state()["deploy"]["status"] == "in-progress", "teardown knows there is something to clean"
    lab.fab("teardown")
    assert ours() == {"containers": [], "networks": [], "images": []}
    assert not (tmp_path / "deploy-local").exists()


def test_an_engine_that_does_not_answer_is_named_before_anything_changes(lab, tmp_path):
    socket = f"unix://{tmp_path}/no-engine.sock"
    lab.extra_env["FABRIC_LAB_DOCKER_ENGINE_HOST"] = socket
    lab.fab("provision", "--target", "local", "--runtime", "docker")
    failed = lab.fab("deploy", check=False)
    assert failed.returncode != 0
    assert f"no Docker engine answers at {socket} (lab.docker.engine_host)" in failed.stdout + failed.stderr
    assert "Add Docker's apt key" not in failed.stdout, "nothing is installed in its place"
    assert not (tmp_path / "deploy-local").exists()
