"""client_scripts/profiling.ipynb, executed headless (nbclient) on results of real perf_analyzer runs.

Two short benchmark runs against the session's tritonserver are written the
way `fab bench` writes them (perf_analyzer CSVs under hosts/<host>/, then
provision.report.write_report for summary.json, report.md and the plots);
the notebook must run top to bottom on them, unattended.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tritonclient.http as triton_http
from nbclient import NotebookClient
from support import notebooks
from support.serving import bench_run, classify

from provision import config, sample_images
from provision.host.tritonserver import perf_analyzer_env
from provision.report import write_report

# One worker runs every test of the session's tritonserver (pytest-xdist's loadgroup): one server, not one per worker.
pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("session_triton")]

NOTEBOOK = config.PROJECT_ROOT / "client_scripts" / "profiling.ipynb"
# Two runs, as `fab bench --quick` would make them on two days: run ids start with their time.
RUNS = {
    "20260101-120000-local": ["food_classifier", "batching_food_classifier"],
    "20260102-120000-local": ["batching_food_classifier"],
}


@pytest.fixture(scope="module")
def results(triton_server, triton_runtime, tmp_path_factory) -> Path:
    """results/ with two real (short) benchmark runs."""
    work = tmp_path_factory.mktemp("bench")
    photo = work / "photo.jpg"
    photo.write_bytes(sample_images.jpeg(seed=3))
    # The input file made by the script the bench task runs on the hosts.
    script = config.PROJECT_ROOT / "client_scripts" / "make_perf_input.py"
    made = subprocess.run(
        [sys.executable, str(script), str(photo), "-o", str(work / "input.json")], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    root = work / "results"
    url = f"{triton_server.host}:{triton_server.http_port}"
    # A model's first inference is slow (the stub warms up): keep it out of the measurement windows.
    with triton_http.InferenceServerClient(url) as client:
        for model in {model for models in RUNS.values() for model in models}:
            classify(client, model, [sample_images.b64(photo.read_bytes())])
    env = perf_analyzer_env(triton_runtime.root)
    for run_id, models in RUNS.items():
        bench_run(root, run_id, models, url, env, work / "input.json")
    return root


def measured(run: Path, model: str) -> set[int]:
    """The concurrency levels a run measured a model at."""
    return {row["concurrency"] for row in json.loads((run / "summary.json").read_text())["models"][model]}


def execute(results: Path, monkeypatch, **env: str) -> tuple[str, int]:
    """Run the notebook in a fresh kernel; (its text and markdown output, how many PNGs it showed); raises on
    any cell error. It profiles nothing unless `env` says what (PROFILE_MODELS, TRITON_URL, PERF_ANALYZER)."""
    monkeypatch.setenv("RESULTS_ROOT", str(results))
    for name in ("RESULTS_DIR", "COMPARE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PROFILE_MODELS", "none")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel runs in the notebook's folder, as Jupyter starts it on the hosts (compare_runs.py is there).
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    return notebooks.outputs(notebook)


def test_the_results_follow_the_bench_format(results):
    summary = json.loads((results / "20260101-120000-local" / "summary.json").read_text())
    assert summary["smoke_weights"] is True
    rows = summary["models"]["batching_food_classifier"]
    concurrency = [row["concurrency"] for row in rows]
    assert concurrency and concurrency == sorted(concurrency) and set(concurrency) <= {1, 2}
    assert all(row["throughput"] > 0 and row["p95_us"] > 0 for row in rows)


def test_the_notebook_opens_the_newest_run_and_compares_it_with_the_one_before(results, monkeypatch):
    text, images = execute(results, monkeypatch)
    assert "opening " + str(results / "20260102-120000-local") in text
    assert "comparing with " + str(results / "20260101-120000-local") in text
    assert "| concurrency | infer/s | p50 ms" in text, "the run's table"
    assert "SMOKE WEIGHTS" in text
    assert "| A infer/s | B infer/s | B/A |" in text, "the comparison, the code of `fab compare`"
    assert "Deployed model configs: the same in every run." in text
    # One row per concurrency both runs measured (perf_analyzer may drop a level on a very busy machine).
    a, b = (measured(results / run, "batching_food_classifier") for run in RUNS)
    assert a & b and all(f"| batching_food_classifier | {level} |" in text for level in a & b)
    assert "Not measured by every run (left out): food_classifier" in text
    assert "hosts/local/batching_food_classifier.csv" in text, "the raw CSV"
    # throughput.png and latency.png of the run, the latency/throughput plot, the comparison plot.
    assert images >= 4


def test_the_notebook_takes_its_runs_from_the_environment(results, monkeypatch):
    text, images = execute(results, monkeypatch, RESULTS_DIR="20260101-120000-local", COMPARE_DIR="none")
    assert "opening " + str(results / "20260101-120000-local") in text
    assert "no second run" in text and "| A infer/s" not in text
    assert "### food_classifier" in text
    assert images >= 3


def test_the_notebook_runs_to_its_end_when_the_newest_run_measured_nothing(results, tmp_path, monkeypatch):
    # A bench that failed at its first model leaves a partial run with no rows: named, not compared.
    root = tmp_path / "results"
    shutil.copytree(results, root)
    newest = root / "20260103-120000-local"
    newest.mkdir()
    summary = json.loads((root / "20260102-120000-local" / "summary.json").read_text())
    summary |= {"run_id": newest.name, "models": {"food_classifier": []},
                "partial": {"reason": "perf_analyzer failed on food_classifier", "not_measured": ["food_classifier"]}}  # fmt: skip
    (newest / "summary.json").write_text(json.dumps(summary))
    (newest / "PARTIAL.md").write_text("# Partial run\n\nperf_analyzer failed on food_classifier\n")
    text, _ = execute(root, monkeypatch)
    assert f"opening {newest}" in text
    assert "not compared: " in text and "the run measured nothing" in text


def test_the_notebook_shows_gpu_metrics_where_a_run_has_them(tmp_path, monkeypatch):
    """A run from a two-GPU host (perf_analyzer --collect-metrics, recorded in tests/data/), no server needed."""
    root = tmp_path / "results"
    run = root / "20260103-120000-ssh"
    host = run / "hosts" / "gpu-host"
    host.mkdir(parents=True)
    shutil.copy(
        Path(__file__).parent / "data" / "perf_analyzer_2gpu_metrics.csv", host / "multigpu_food_classifier.csv"
    )
    write_report(
        run,
        run_id=run.name,
        target="ssh",
        profile={"name": "quick", "concurrency_range": "2:6:2", "measurement_interval_ms": 2000},
        commands={"multigpu_food_classifier": "perf_analyzer -m multigpu_food_classifier --collect-metrics"},
        smoke_weights=False,
        git={"commit": None, "dirty": False},
    )
    text, images = execute(root, monkeypatch, COMPARE_DIR="none")
    assert "| model | concurrency | GPU | utilisation % | memory used / total MiB | power W |" in text
    assert "| multigpu_food_classifier | 2 | GPU-3f2a9c4e | 67.3 | 2539 / 16281 | 75.7 |" in text
    assert "no GPU metrics in this run" not in text
    assert images >= 4, "throughput.png, latency.png, gpu_utilization.png and the latency/throughput plot"


def test_the_notebook_opens_a_server_scenario_run_and_does_not_compare_it_with_a_closed_loop_one(
    results, tmp_path, monkeypatch
):
    """A run of fab bench --scenario server (perf_analyzer's search, recorded in tests/data/) beside the closed-loop
    runs: its rates, sustained rate and latency split are shown; it is compared with no closed-loop run."""
    root = tmp_path / "results"
    shutil.copytree(results, root)
    run = root / "20260104-120000-local-server"
    host = run / "hosts" / "local"
    host.mkdir(parents=True)
    data = Path(__file__).parent / "data"
    shutil.copy(data / "perf_analyzer_request_rate.csv", host / "food_classifier.csv")
    shutil.copy(data / "perf_analyzer_request_rate.log", host / "food_classifier.log")
    write_report(
        run, run_id=run.name, target="local", profile={"name": "quick", "request_rate_range": "1:40:1",
        "concurrency_range": "2:4:2", "measurement_interval_ms": 2000}, commands={"food_classifier": "perf_analyzer"},
        smoke_weights=True, git={"commit": None, "dirty": False}, server_p99_ms=300,
    )  # fmt: skip
    text, _ = execute(root, monkeypatch)
    assert "opening " + str(run) in text
    assert "server scenario, rates 1:40:1" in text
    # perf_analyzer sent 1.0 request/s where it was asked for 1.6 (none late): the rate is quoted as sent.
    assert "Sustainable rate (p99 <= 300 ms, sent on schedule and answered): **1.0 requests/s sent and answered** " \
        "(asked: 1.60938/s)" in text
    assert "| requests/s (Poisson) | infer/s | p50 ms" in text and "| 1.60938 | 1.0 | 29.2 |" in text
    assert "| requests/s (Poisson) | client send | network + server send/recv | queue |" in text, "the report's split"
    assert "no second run" in text, "the closed-loop runs before it are not its kind"
    text, _ = execute(root, monkeypatch, COMPARE_DIR="20260102-120000-local")
    assert "not compared: the runs measured different scenarios" in text and "| A infer/s" not in text


def profile_env(triton_server, triton_runtime, **env: str) -> dict:
    """What Jupyter's environment holds on a host (provision.host.process_runtime): the Triton beside it,
    perf_analyzer and its libraries; and which models to profile."""
    libraries = perf_analyzer_env(triton_runtime.root, {})["LD_LIBRARY_PATH"]
    return {
        "TRITON_URL": f"{triton_server.host}:{triton_server.http_port}",
        "PERF_ANALYZER": str(Path(sys.executable).parent / "perf_analyzer"),
        "LD_LIBRARY_PATH": libraries,
        **env,
    }


def test_the_notebook_profiles_the_models_itself_as_fab_bench_does(results, triton_server, triton_runtime, monkeypatch):
    text, _ = execute(
        results, monkeypatch, **profile_env(triton_server, triton_runtime, PROFILE_MODELS="batching_food_classifier")
    )
    url = f"{triton_server.host}:{triton_server.http_port}"
    assert f"profiling batching_food_classifier at concurrency 1:2:1 against {url}" in text
    section = text.split("### batching_food_classifier, profiled here", 1)[1]
    assert "| concurrency | infer/s | p50 ms | p90 ms | p95 ms | p99 ms | avg ms |" in section
    assert "| 1 | " in section and "| 2 | " in section, "both levels measured"
    assert "| concurrency | client send | network + server send/recv | queue |" in section, "the report's split"
    # fab bench's own command line, with the opened run's windows (windows of 8 requests: support.serving).
    assert f"perf_analyzer: `{Path(sys.executable).parent / 'perf_analyzer'} -m batching_food_classifier -u {url}" in section
    assert "--measurement-mode count_windows --measurement-request-count 8 --stability-percentage 999" in section
    statistics = section.split("/v2/models/<model>/stats", 1)[1]
    row = next(line for line in statistics.splitlines() if line.startswith("| batching_food_classifier |"))
    requests, failed, executions = (int(cell) for cell in row.split("|")[2:5])
    assert requests > 0 and failed == 0 and 0 < executions <= requests, row


def test_the_notebook_profiles_where_no_run_has_been_benched_yet(tmp_path, triton_server, triton_runtime, monkeypatch):
    empty = tmp_path / "results"
    empty.mkdir()
    text, _ = execute(empty, monkeypatch, **profile_env(triton_server, triton_runtime, PROFILE_MODELS="food_classifier"))
    assert "no benchmark run here yet" in text
    assert "### food_classifier, profiled here" in text and "| food_classifier | " in text
    assert "--measurement-request-count 20" in text, "short windows of its own"
