"""The cluster section of a `fab bench --cluster` run: aggregate figures, per-node figures, scaling.

results/<run-id>/
  cluster/              the clients' CSVs (cluster-<model>-c<level>-<k>.csv), logs, side_by_side_report.json
  cluster.json          what the section shows, as data
  cluster.png           throughput vs concurrency per node: each node alone, the cluster, N x the nodes' mean
  report.md             gets a "Cluster" section; summary.json a "cluster" key

At each level c the cluster is measured with K clients side by side, each at concurrency c
(K x c requests in flight), and each node alone at c: the cluster's throughput is the sum of
its clients', its latency percentiles the worst client's. Scaling efficiency = the cluster's
best throughput / (N x the mean of the nodes' best throughputs).
"""

from __future__ import annotations

import json
from pathlib import Path

from provision import perf
from provision.measure import RunFolder
from provision.measure import run_folder as run_folder_format

# A client that kept more than this share of a core busy may itself have limited the throughput.
CLIENT_BUSY_SHARE = 0.8


def group_name(model: str, level: int) -> str:
    """The name of one level's clients, run side by side (provision.host.side_by_side: their logs are <name>-<k>.log)."""
    return f"{model}-c{level}"


def client_csv(model: str, level: int, client: int) -> str:
    return f"cluster-{group_name(model, level)}-{client}.csv"


def summarize(
    results: Path, balancer: str, nodes: list[str], clients: int, levels: list[int], models: list[str]
) -> dict:
    """The cluster's figures from results/cluster/ and each node's from results/hosts/<node>/."""
    report = json.loads((results / "cluster" / "side_by_side_report.json").read_text())
    cpu_share = {
        group["name"]: max((run["cpu_s"] / group["wall_s"] for run in group["runs"]), default=0.0)
        for group in report
        if group["wall_s"] > 0
    }
    load = {group["name"]: group.get("load") for group in report}
    summary = {"balancer": balancer, "nodes": nodes, "clients": clients, "models": {}}
    for model in models:
        alone = {node: _by_level(results / "hosts" / node / f"{model}.csv") for node in nodes}
        rows = []
        for level in levels:
            measured = [results / "cluster" / client_csv(model, level, k) for k in range(1, clients + 1)]
            client_rows = [perf.parse_csv(path)[0] for path in measured if path.exists()]
            row = {
                "concurrency_per_node": level,
                "in_flight": level * clients,
                "clients_measured": len(client_rows),
                "nodes_alone": {node: alone[node].get(level) for node in nodes},
                "busiest_client_core_share": round(cpu_share.get(group_name(model, level), 0.0), 3),
                "balancer_host_load": load.get(group_name(model, level)),  # as the level's clients ended
            }
            if len(client_rows) == clients:  # a level some client could not measure has no aggregate
                row["throughput"] = sum(r["throughput"] for r in client_rows)
                row["p50_ms"] = max(r["p50_us"] for r in client_rows) / 1000
                row["p99_ms"] = max(r["p99_us"] for r in client_rows) / 1000
            rows.append(row)
        summary["models"][model] = {"levels": rows, "efficiency": _efficiency(rows, alone)}
    return summary


def _by_level(csv_file: Path) -> dict[int, float]:
    """{concurrency: throughput} of a node measured alone ({} if it could not be measured)."""
    return {row["concurrency"]: row["throughput"] for row in perf.parse_csv(csv_file)} if csv_file.exists() else {}


def _efficiency(rows: list[dict], alone: dict[str, dict[int, float]]) -> float | None:
    cluster_best = max((row["throughput"] for row in rows if "throughput" in row), default=None)
    node_bests = [max(levels.values()) for levels in alone.values() if levels]
    if cluster_best is None or len(node_bests) < len(alone):
        return None
    return round(cluster_best / (len(alone) * sum(node_bests) / len(node_bests)), 3)


def markdown(summary: dict) -> str:
    nodes, clients = summary["nodes"], summary["clients"]
    busiest = max(
        (row["busiest_client_core_share"] for m in summary["models"].values() for row in m["levels"]), default=0
    )
    verdict = (
        "below the point where a client limits what it measures"
        if busiest < CLIENT_BUSY_SHARE
        else "**a client was busy most of the time: it may have limited the cluster's figures** "
        "(more clients: lab.bench.cluster_clients)"
    )
    lines = [
        f"## Cluster: {len(nodes)} node{'s' if len(nodes) != 1 else ''} behind one balancer",
        "",
        f"HAProxy on {summary['balancer']} (least connections, health checks on /v2/health/ready). "
        f"Through it: {clients} perf_analyzer client{'s' if clients != 1 else ''} side by side on the balancer's host, each at the "
        f"concurrency below ({clients} x that in flight); each node measured alone at that concurrency, "
        "one node at a time, in the same run. The cluster's throughput is the sum of its clients', its "
        "latencies the worst client's.",
        "",
        f"Clients as the bottleneck: the busiest client kept {busiest:.0%} of a core busy (its CPU time over the "
        f"measurement's wall time), {verdict}.",
        "",
        "Scaling efficiency = the cluster's best throughput / (N x the mean of the nodes' best throughputs):",
        "",
    ]
    for model, figures in summary["models"].items():
        efficiency = figures["efficiency"]
        lines.append(f"- {model}: {'not measured' if efficiency is None else f'{efficiency:.2f}'}")
    lines += _busy_balancer(summary)
    lines += ["", "![cluster](cluster.png)", ""]
    header = (
        "| model | concurrency per node | cluster infer/s | p50 ms | p99 ms | "
        + " | ".join(f"{node} alone" for node in nodes)
        + " |"
    )
    lines += [header, "|" + "---|" * (5 + len(nodes))]
    for model, figures in summary["models"].items():
        for row in figures["levels"]:
            measured = "throughput" in row
            cells = [
                model,
                str(row["concurrency_per_node"]),
                f"{row['throughput']:.1f}" if measured else "not measured",
                f"{row['p50_ms']:.1f}" if measured else "",
                f"{row['p99_ms']:.1f}" if measured else "",
                *(_cell(row["nodes_alone"][node]) for node in nodes),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _busy_balancer(summary: dict) -> list[str]:
    """The levels measured while the balancer's host was busy (run_folder.busy): their figures may be low."""
    run_folder = run_folder_format()
    busy = [
        f"{model} at {row['concurrency_per_node']} ({run_folder.load_words(row['balancer_host_load'])})"
        for model, figures in summary["models"].items()
        for row in figures["levels"]
        if run_folder.busy(row.get("balancer_host_load"))
    ]
    if not busy:
        return []
    return [
        "",
        f"> **BUSY HOST**: the balancer's host ran its clients under a load average above its cores: {'; '.join(busy)}. "
        "Those levels' figures may be low.",
    ]


def _cell(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.1f}"


def plot(results: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = summary["models"]
    figure, panels = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    count = len(summary["nodes"])
    for panel, (model, figures) in zip(panels[0], models.items()):
        rows = figures["levels"]
        levels = [row["concurrency_per_node"] for row in rows]
        for node in summary["nodes"]:
            panel.plot(levels, [row["nodes_alone"][node] for row in rows], marker=".", label=f"{node} alone")
        panel.plot(levels, [row.get("throughput") for row in rows], marker="o", linewidth=2, label="cluster")
        ideal = [
            count * sum(values) / len(values) if (values := [v for v in row["nodes_alone"].values() if v]) else None
            for row in rows
        ]
        panel.plot(levels, ideal, linestyle="--", color="grey", label=f"{count} x the nodes' mean")
        panel.set(title=model, xlabel="concurrency per node", xticks=levels)
        panel.grid(alpha=0.3)
    panels[0][0].set_ylabel("throughput (infer/s)")
    panels[0][0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(results / "cluster.png", dpi=110)
    plt.close(figure)


def write(run: RunFolder, summary: dict) -> None:
    """cluster.json, cluster.png, the section at the end of report.md and summary.json's "cluster"."""
    (run.path / "cluster.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(run.path, summary)
    with open(run.path / "report.md", "a") as report:
        report.write("\n" + markdown(summary))
    run.add_to_summary("cluster", summary)
