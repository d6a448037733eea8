"""`fab bench --cluster`: its report section, from perf_analyzer CSVs as the hosts send them back, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import cluster_report, runtimes
from provision.bench import BenchError, bench
from provision.config import settings as lab_settings
from provision.state import Host, State

NODES = ["node-1", "node-2"]


def perf_csv(path: Path, rows: dict[int, tuple[float, float]]) -> None:
    """A perf_analyzer CSV: {concurrency: (infer/s, p99 ms)}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["Concurrency,Inferences/Second,p50 latency,p90 latency,p95 latency,p99 latency"]
    for level, (throughput, p99_ms) in rows.items():
        lines.append(f"{level},{throughput},{p99_ms * 500:.0f},{p99_ms * 800:.0f},{p99_ms * 900:.0f},{p99_ms * 1000:.0f}")
    path.write_text("\n".join(lines) + "\n")


def bench_folder(tmp_path: Path, client_cpu_s: float = 1.0) -> Path:
    """Two nodes alone at concurrency 2 and 4, two clients through the balancer at each level."""
    perf_csv(tmp_path / "hosts/node-1/food_classifier.csv", {2: (20.0, 110), 4: (22.0, 190)})
    perf_csv(tmp_path / "hosts/node-2/food_classifier.csv", {2: (18.0, 120), 4: (20.0, 200)})
    for level, per_client in ((2, 17.0), (4, 19.5)):
        for client in (1, 2):
            name = cluster_report.client_csv("food_classifier", level, client)
            perf_csv(tmp_path / "cluster" / name, {level: (per_client, 150 + 10 * client + level)})
    report = [
        {"name": f"food_classifier-c{level}", "wall_s": 10.0, "runs": [{"rc": 0, "cpu_s": client_cpu_s}] * 2}
        for level in (2, 4)
    ]
    (tmp_path / "cluster/side_by_side_report.json").write_text(json.dumps(report))
    return tmp_path


def test_the_cluster_sums_its_clients_and_is_compared_with_n_times_the_nodes_mean(tmp_path):
    summary = cluster_report.summarize(bench_folder(tmp_path), "node-1", NODES, 2, [2, 4], ["food_classifier"])

    figures = summary["models"]["food_classifier"]
    at_4 = figures["levels"][1]
    assert at_4["concurrency_per_node"] == 4 and at_4["in_flight"] == 8
    assert at_4["throughput"] == 39.0  # 2 x 19.5
    assert at_4["p99_ms"] == 174.0  # the worst client's
    assert at_4["nodes_alone"] == {"node-1": 22.0, "node-2": 20.0}
    # best cluster 39.0 / (2 x mean(22, 20) = 42.0)
    assert figures["efficiency"] == 0.929


def test_the_report_says_whether_a_client_was_busy_enough_to_be_the_bottleneck(tmp_path):
    idle = cluster_report.markdown(
        cluster_report.summarize(bench_folder(tmp_path / "a"), "node-1", NODES, 2, [2, 4], ["food_classifier"])
    )
    assert "## Cluster: 2 nodes behind one balancer" in idle
    assert "- food_classifier: 0.93" in idle
    assert "the busiest client kept 10% of a core busy" in idle and "may have limited" not in idle
    assert "| food_classifier | 4 | 39.0 | " in idle and "| 22.0 | 20.0 |" in idle

    busy = cluster_report.markdown(
        cluster_report.summarize(bench_folder(tmp_path / "b", 9.5), "node-1", NODES, 2, [2, 4], ["food_classifier"])
    )
    assert "kept 95% of a core busy" in busy and "it may have limited the cluster's figures" in busy


def test_a_level_whose_clients_ended_on_a_busy_balancer_host_is_flagged(tmp_path):
    folder = bench_folder(tmp_path)
    report = json.loads((folder / "cluster/side_by_side_report.json").read_text())
    report[0]["load"] = {"load_average": 0.5, "cores": 2}
    report[1]["load"] = {"load_average": 4.5, "cores": 2}
    (folder / "cluster/side_by_side_report.json").write_text(json.dumps(report))
    summary = cluster_report.summarize(folder, "node-1", NODES, 2, [2, 4], ["food_classifier"])
    assert summary["models"]["food_classifier"]["levels"][1]["balancer_host_load"] == {"load_average": 4.5, "cores": 2}
    text = cluster_report.markdown(summary)
    assert "> **BUSY HOST**: the balancer's host ran its clients under a load average above its cores: " in text
    assert "food_classifier at 4 (load average 4.50 on 2 cores)" in text and "food_classifier at 2 " not in text


def test_a_level_a_client_could_not_measure_has_no_aggregate(tmp_path):
    folder = bench_folder(tmp_path)
    (folder / "cluster" / cluster_report.client_csv("food_classifier", 4, 2)).unlink()
    figures = cluster_report.summarize(folder, "node-1", NODES, 2, [2, 4], ["food_classifier"])["models"]
    at_4 = figures["food_classifier"]["levels"][1]
    assert at_4["clients_measured"] == 1 and "throughput" not in at_4
    assert figures["food_classifier"]["efficiency"] == round(34.0 / 42.0, 3)  # the best level measured: 2
    assert "| food_classifier | 4 | not measured |" in cluster_report.markdown(
        cluster_report.summarize(folder, "node-1", NODES, 2, [2, 4], ["food_classifier"])
    )


def deployed_state(runtime: str, cluster: dict) -> State:
    hosts = [Host(name=name, address=f"10.0.0.{index}") for index, name in enumerate(NODES, start=1)]
    deployed = {name: {"home": "/home/cc/triton-lab", "serving_python": "/usr/bin/python3"} for name in NODES}
    state = State(target="ssh", hosts=hosts, runtime=runtime)
    state.deploy = {"status": "deployed", "hosts": deployed, "ports": lab_settings()["ports"], "cluster": cluster}
    return state


def test_a_cluster_bench_needs_a_deployed_cluster(tmp_path):
    settings = lab_settings({"results_dir": str(tmp_path)})
    with pytest.raises(BenchError, match=r"no cluster is deployed: `fab deploy --cluster` first"):
        bench(settings, deployed_state("process", {}), cluster=True)
    assert list(tmp_path.iterdir()) == [], "refused before anything was written"


def test_the_server_scenario_is_refused_on_a_cluster_before_anything_is_written(tmp_path):
    settings = lab_settings({"results_dir": str(tmp_path)})
    with pytest.raises(BenchError, match=r"--scenario server measures each host alone: drop --cluster"):
        bench(settings, deployed_state("process", {}), cluster=True, server_p99_ms=300)
    assert list(tmp_path.iterdir()) == [], "refused before anything was written"


def test_the_clients_run_where_the_balancer_s_loopback_is_theirs():
    deployed = deployed_state("docker", {}).deploy["hosts"]["node-1"]
    # process: the serving virtualenv's perf_analyzer, on the host itself.
    on_host = runtimes.cluster_clients_place("process", deployed, "run-1")
    assert on_host == runtimes.bench_place("process", deployed, "run-1")
    assert on_host["exec"] == [] and on_host["tools"] == "/usr/bin/"
    # docker: not in the API container (its loopback is its own), but a container of the API image
    # on the host's network, with the bench folder as its working folder.
    in_container = runtimes.cluster_clients_place("docker", deployed, "run-1")
    assert in_container["exec"] == [
        "docker", "compose", "--file", "/home/cc/triton-lab/compose.yaml", "run", "--rm", "--no-TTY",
        "--workdir", "/app/bench/run-1", "clients",
    ]  # fmt: skip
    assert in_container["tools"] == "" and in_container["become"]
