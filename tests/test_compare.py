"""`fab compare`: two real benchmark runs, the second with a changed model config.

A tritonserver of this module's own serves batching_food_classifier; run A
measures it as rendered, then its config gets a 200 ms max_queue_delay
(loaded through the repository API, as a re-deploy does) and run B measures
that. At concurrency 1 every request of B waits out the delay for a batch
that never fills: B serves at most 5/s where A serves tens, a regression that
compare must name along with the config line that caused it. (Throughput,
not p99: in windows this short one slow request of a busy machine can set
A's p99 by itself.)
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
import tritonclient.http as triton_http
from support.lab import new_lab
from support.repository import rendered_repository
from support.serving import bench_run, classify

from provision import sample_images
from provision.host.tritonserver import TritonProcess, perf_analyzer_env
from provision.perf import write_input_json

# One worker runs them all (pytest-xdist's loadgroup): the module's two measured runs are made once.
pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("compare")]

MODEL = "batching_food_classifier"
RUN_A, RUN_B = "20260201-120000-local", "20260202-120000-local"
SLOW_QUEUE = "max_queue_delay_microseconds: 200000"


@pytest.fixture(scope="module")
def results(tmp_path_factory, render_values, triton_runtime):
    """results/ with run A (the config as rendered) and run B (a 200 ms queue delay), both measured for real."""
    repository = rendered_repository(tmp_path_factory.mktemp("repo"), render_values, {MODEL})
    server = TritonProcess.on_free_ports(triton_runtime.root, repository, tmp_path_factory.mktemp("run"))
    server.start([MODEL], timeout_s=300)
    try:
        url = f"{server.host}:{server.http_port}"
        with triton_http.InferenceServerClient(url) as client:  # the stub's slow first inferences, out of the windows
            for _ in range(5):
                classify(client, MODEL, [sample_images.jpeg(seed=4)])
        work = tmp_path_factory.mktemp("bench")
        input_json = write_input_json(work / "input.json", [sample_images.jpeg(seed=4)])
        root = work / "results"
        env = perf_analyzer_env(triton_runtime.root)
        config = repository / MODEL / "config.pbtxt"
        bench_run(root, RUN_A, [MODEL], url, env, input_json, {MODEL: config.read_text()}, "1", request_count=30)

        text = config.read_text()
        start = text.index("max_queue_delay_microseconds:")
        config.write_text(text[:start] + SLOW_QUEUE + text[text.index("\n", start) :])
        load = urllib.request.Request(f"{server.url}/v2/repository/models/{MODEL}/load", data=b"{}", method="POST")
        with urllib.request.urlopen(load, timeout=120) as response:
            assert response.status == 200
        bench_run(root, RUN_B, [MODEL], url, env, input_json, {MODEL: config.read_text()}, "1", request_count=30)
    finally:
        server.stop()
    return root


def test_compare_shows_the_config_difference_the_ratios_and_the_regression(results, tmp_path):
    lab = new_lab(tmp_path)
    lab.extra_env["FABRIC_LAB_RESULTS_DIR"] = str(results)  # run ids are found there, compare/ is written there
    done = lab.fab("compare", RUN_A, RUN_B)
    out = results / "compare" / f"{RUN_A}_vs_{RUN_B}"
    assert f"report: {out / 'compare.md'}" in done.stdout
    assert f"differ in: deployed config {RUN_B}: {MODEL}" in done.stdout
    report = (out / "compare.md").read_text()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # What differs: the deployed config, as a diff from A to B; nothing else changed between the runs.
    assert "Commit, versions, hardware, weights and profile: the same in every run." in report
    assert f"`{RUN_B}: {MODEL}`" in report
    assert "\n-  max_queue_delay_microseconds: 100\n" in report and f"\n+  {SLOW_QUEUE}\n" in report

    # The figures side by side, with B's ratios to A, from the two summaries.
    a, b = (json.loads((results / run / "summary.json").read_text())["models"][MODEL][0] for run in (RUN_A, RUN_B))
    row = next(line for line in report.splitlines() if line.startswith(f"| {MODEL} | 1 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2:5] == [
        f"{a['throughput']:.1f}",
        f"{b['throughput']:.1f}",
        f"{b['throughput'] / a['throughput']:.2f}x",
    ]
    assert cells[5:9] == [
        f"{a['p95_us'] / 1000:.1f}",
        f"{b['p95_us'] / 1000:.1f}",
        f"{a['p99_us'] / 1000:.1f}",
        f"{b['p99_us'] / 1000:.1f}",
    ]
    assert cells[9] == f"{b['p99_us'] / a['p99_us']:.2f}x"

    # The 200 ms queue delay at concurrency 1 is a throughput regression, named on the console and in
    # the report; --fail-on-regression makes it the exit code.
    assert b["throughput"] / a["throughput"] < 0.9, "the slow queue did not slow the run: the test proves nothing"
    regression = next(line for line in done.stdout.splitlines() if line.startswith(f"REGRESSION {RUN_B}: {MODEL} c=1"))
    assert regression.startswith(f"REGRESSION {RUN_B}: {MODEL} c=1 throughput x{b['throughput'] / a['throughput']:.2f}")
    assert regression.endswith(f"(indicative: {RUN_A}, {RUN_B} used the quick profile)"), "as compare.md says"
    assert f"| {RUN_B} | {MODEL} | 1 | throughput | {b['throughput'] / a['throughput']:.2f}x |" in report
    # Where the time went: the queue, which the 200 ms delay lengthens, grew most (the split of each run).
    assert "## Where the latency changed" in report and "| server queue |" in report
    assert "; the average mostly in server queue (+" in done.stdout
    failing = lab.fab("compare", RUN_A, RUN_B, "--fail-on-regression", check=False)
    assert failing.returncode == 1 and "regression(s) beyond 10%" in failing.stderr
    assert lab.fab("compare", RUN_A, RUN_B, "--threshold", "100", "--fail-on-regression").returncode == 0


def test_runs_that_cannot_be_compared_get_one_message_and_nothing_is_written(results, tmp_path):
    lab = new_lab(tmp_path)
    other_project = tmp_path / "someone-elses-run"
    other_project.mkdir()
    (other_project / "summary.json").write_text(json.dumps({"throughput": 12.5}))
    unfinished = tmp_path / "20260203-120000-local"
    (unfinished / "hosts").mkdir(parents=True)
    no_common = tmp_path / "20260204-120000-local"
    shutil.copytree(results / RUN_B, no_common)
    summary = json.loads((no_common / "summary.json").read_text())
    summary["models"] = {"food_classifier": summary["models"][MODEL]}
    (no_common / "summary.json").write_text(json.dumps(summary))
    server = tmp_path / "20260205-120000-local-server"  # fab bench --scenario server: one rate per model
    shutil.copytree(results / RUN_B, server)
    summary = json.loads((server / "summary.json").read_text())
    summary.update(run_id=server.name, scenario="server")
    (server / "summary.json").write_text(json.dumps(summary))

    cases = {
        "nope": "no such run folder",
        str(unfinished): "no summary.json",
        str(other_project): "has no run_id, models, hosts, profile: not a summary written by `fab bench`",
        str(no_common): "the runs have no model and concurrency in common",
        str(results / RUN_A): "the same run given twice",
        str(server): f"the runs measured different scenarios ({RUN_A}: closed_loop, {server.name}: server)",
    }
    for run, message in cases.items():
        done = lab.fab("compare", str(results / RUN_A), run, check=False)
        assert done.returncode == 1 and message in done.stderr, (run, done.stderr)
    assert not (lab.results_dir / "compare").exists() and not (tmp_path / "compare").exists()


def test_more_runs_are_compared_to_the_first(results, tmp_path):
    lab = new_lab(tmp_path)
    third = tmp_path / "20260205-120000-local"
    shutil.copytree(results / RUN_B, third)
    summary = json.loads((third / "summary.json").read_text())
    (third / "summary.json").write_text(json.dumps({**summary, "run_id": third.name}))
    done = lab.fab(
        "compare", str(results / RUN_A), str(results / RUN_B), "--also", str(third), "--out", str(tmp_path / "out")
    )
    assert "compared 3 runs" in done.stdout
    report = (tmp_path / "out" / "compare.md").read_text()
    assert f"- **C** `{third.name}`" in report
    assert "| A infer/s | B infer/s | B/A | C infer/s | C/A |" in report
    assert f"| {third.name} | {MODEL} | 1 | throughput |" in report, "C is B's figures: the same regression against A"


@pytest.mark.parametrize(
    "reason",
    ["the lease ends soon", "perf_analyzer failed on ensemble (exit 99: Couldn't connect to server)"],
    ids=["stopped by the lease", "a failed measurement"],
)
def test_a_run_that_stopped_early_is_named_partial_among_what_differs(results, tmp_path, reason):
    lab = new_lab(tmp_path)
    stopped = tmp_path / "20260206-120000-chameleon"
    shutil.copytree(results / RUN_A, stopped)
    summary = json.loads((stopped / "summary.json").read_text())
    partial = {"reason": reason, "not_measured": ["ensemble"]}
    (stopped / "summary.json").write_text(json.dumps({**summary, "run_id": stopped.name, "partial": partial}))
    lab.fab("compare", str(results / RUN_A), str(stopped), "--out", str(tmp_path / "out"))
    report = (tmp_path / "out" / "compare.md").read_text()
    assert f"| complete | complete | partial ({reason}; not measured: ensemble) |" in report, report
