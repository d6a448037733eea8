"""The results of a bench run: summary.json, report.md and plots, from what the hosts sent back.

results/<run-id>/
  summary.json          {"run_id", "models": {model: [{concurrency, throughput, p50_us, ...}]}, ...}
                        with GPU metrics (perf_analyzer --collect-metrics) a row also has
                        "gpus": {uuid: {utilization, power_w, memory_used_bytes, memory_total_bytes}},
                        and "gpu_metrics": {"collected", "gpus", "units"} says whether any were
  report.md             tables, the best configuration, published P100 figures on P100 hosts,
                        GPU utilisation/memory/power per concurrency where collected
  throughput.png        throughput vs concurrency, one line per model
  latency.png           p50/p90/p95/p99 vs concurrency, one panel per model
  gpu_utilization.png   GPU utilisation vs concurrency, one line per model and GPU (only with GPU metrics)
  hosts/<host>/         raw perf_analyzer CSVs and logs, host.json, configs/ as deployed
  input.jpg             the benchmark image (hosts/<host>/input.json: perf_analyzer input made from it)
"""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

from provision import perf, server_report
from provision.config import client_script
from provision.measure import RunFolder
from provision.measure import run_folder as run_folder_format
from provision.model_repo import gpu_variants
from provision.perf import concurrency_levels, host_load, unstable_reason

# The units of a row's "gpus" entries (client_scripts/perf_run.py's GPU_COLUMNS: as perf_analyzer writes them).
GPU_UNITS = {
    "utilization": "fraction of time busy, 0..1, averaged over the measurement windows",
    "power_w": "watts, averaged over the measurement windows",
    "memory_used_bytes": "bytes, the peak over the measurement windows",
    "memory_total_bytes": "bytes",
}
MIB = 1024 * 1024

# summary["input_encoding"] in the report's words (runs from before it was recorded sent base64).
INPUT_ENCODING_WORDS = {
    "raw": "one image per request, sent as the file's bytes (lab.bench.input_encoding: raw)",
    "base64": "one image per request, sent as its base64 text (lab.bench.input_encoding: base64)",
}

# serve-system-chi on 2 x P100 (the figures the course publishes), concurrency 8 unless noted.
PUBLISHED_P100 = [
    ("python backend, 1 instance, no batching", "8", 52.4, 152),
    ("+ dynamic batching", "8", 78.6, 101),
    ("+ 2 instances on each of 2 GPUs", "8", 192.8, 41),
    ("+ 4 instances on each of 2 GPUs", "8", 118.7, 68),
    ("ONNX backend, 2 instances on GPUs [0,1]", "8 / 16", "1182 / 1257", "6.1 / 12.0"),
]
# Which of our models corresponds to which published row (for the side-by-side table).
PUBLISHED_COUNTERPART = {
    "gpu_food_classifier": "python backend, 1 instance, no batching",
    "batching_food_classifier": "+ dynamic batching",
    "multigpu_food_classifier": "+ 2 instances on each of 2 GPUs",
}


def _load_host(folder: Path) -> dict:
    facts_file = folder / "host.json"
    facts = json.loads(facts_file.read_text()) if facts_file.exists() else {}
    logs = {log.stem: log.read_text(errors="replace") for log in sorted(folder.glob("*.log"))}
    # The server scenario's rows carry what perf_analyzer's log says of each rate: how many requests it sent late.
    models = {
        csv.stem: perf.with_rate_facts(perf.parse_csv(csv), logs.get(csv.stem, "")) for csv in sorted(folder.glob("*.csv"))
    }
    configs = {c.stem: c.name for c in sorted((folder / "configs").glob("*.pbtxt"))}
    # The load each measurement ended under (bench.yml's "host load" line in its log).
    load = {model: figures for model, text in logs.items() if (figures := host_load(text))}
    return {"facts": facts, "models": models, "configs": configs, "load": load}


def _missing_levels(models: dict[str, list[dict]], profile: dict, benchmarked: list[str]) -> dict[str, list[int]]:
    """Levels perf_analyzer gave up on (no stable measurement), per benchmarked model; all of them
    for a model it measured at no level (it then stops and writes no CSV)."""
    expected = concurrency_levels(profile["concurrency_range"])
    missing = {}
    for model in benchmarked:
        measured = {row["concurrency"] for row in models.get(model, [])}
        if [level for level in expected if level not in measured]:
            missing[model] = [level for level in expected if level not in measured]
    return missing


def _unstable_reasons(folder: Path, benchmarked: list[str]) -> dict[str, str]:
    """perf_analyzer's words for each benchmarked model it gave up on at some level (its log on the host)."""
    reasons = {}
    for model in benchmarked:
        log = folder / f"{model}.log"
        reason = unstable_reason(log.read_text(errors="replace")) if log.exists() else None
        if reason:
            reasons[model] = reason
    return reasons


def _best(models: dict[str, list[dict]]) -> dict | None:
    candidates = [(row["throughput"], model, row) for model, rows in models.items() for row in rows]
    if not candidates:
        return None
    throughput, model, row = max(candidates, key=lambda c: c[0])
    return {"model": model, "concurrency": row["concurrency"], "throughput": throughput, "p95_us": row.get("p95_us")}


def gpu_uuids(models: dict[str, list[dict]]) -> list[str]:
    """The GPUs any row has metrics for; [] when none were collected (a CPU host, or no --collect-metrics)."""
    return sorted({uuid for rows in models.values() for row in rows for uuid in row.get("gpus", {})})


def _gpu_labels(uuids: list[str]) -> dict[str, str]:
    """Short names for the tables and plots: "GPU-3f2a9c4e", or the whole UUID where those collide."""
    short = {uuid: uuid[:12] for uuid in uuids}
    return short if len(set(short.values())) == len(uuids) else {uuid: uuid for uuid in uuids}


def _has_p100(facts: dict) -> bool:
    return any("P100" in gpu.get("name", "") for gpu in facts.get("gpus", []))


def ran_on_the_cpu(models: list[str], facts: dict) -> list[str]:
    """The GPU variants among `models` when the host has no GPU: Triton ran their instances on the CPU."""
    return [] if facts.get("gpus") else [model for model in models if model in gpu_variants()]


def label(model: str, on_cpu: list[str]) -> str:
    """A model's name in tables, plots and the best configuration: a GPU variant on a CPU host says so."""
    return f"{model} (on the CPU: no GPU on this host)" if model in on_cpu else model


def throughput_figure(models: dict[str, list[dict]], title: str, on_cpu: list[str] = ()):
    """throughput.png's figure: concurrency on an axis of its integer levels, throughput from zero."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for model, rows in models.items():
        axes.plot(
            [r["concurrency"] for r in rows], [r["throughput"] for r in rows], marker="o", label=label(model, on_cpu)
        )
    levels = sorted({r["concurrency"] for rows in models.values() for r in rows})
    axes.set(
        xlabel="concurrency (requests in flight)",
        ylabel="throughput (infer/s)",
        title=f"Throughput vs concurrency{title}",
    )
    if levels:
        axes.set_xticks(levels)
    axes.set_ylim(bottom=0)  # from zero: 40 -> 56 must not look like double
    axes.grid(alpha=0.3)
    if models:
        axes.legend(fontsize="small")
    else:
        _nothing_measured(axes)
    figure.tight_layout()
    return figure


def _save(figure, png: Path, stamp: str) -> None:
    """The figure as PNG and as SVG (its text kept as text, for a paper), the run it shows written on it;
    a tight bounding box, so no title or legend is clipped."""
    import matplotlib

    if stamp:
        figure.text(0.995, 0.002, stamp, ha="right", va="bottom", fontsize=6, color="0.4")
    figure.savefig(png, dpi=110, bbox_inches="tight")
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(png.with_suffix(".svg"), bbox_inches="tight")


def throughput_vs_latency_figure(models: dict[str, list[dict]], title: str, on_cpu: list[str] = ()):
    """throughput_vs_latency.png's figure, the usual picture of serving (as Model Analyzer draws it):
    throughput against p99 latency, one curve per model, each point labelled with its concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for model, rows in models.items():
        p99 = [r["p99_us"] / 1000 for r in rows]
        throughput = [r["throughput"] for r in rows]
        (line,) = axes.plot(p99, throughput, marker="o", label=label(model, on_cpu))
        for x, y, r in zip(p99, throughput, rows):
            axes.annotate(f"c={r['concurrency']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                          color=line.get_color())  # fmt: skip
    axes.set(xlabel="p99 latency (ms)", ylabel="throughput (infer/s)", title=f"Throughput vs p99 latency{title}")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    if models:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        _nothing_measured(axes)
    figure.tight_layout()
    return figure


# A panel title's width in characters: a panel is 4 inches wide, and a model's label on a CPU host
# ("multigpu_food_classifier (on the CPU: no GPU on this host)") would run into the next panel's.
PANEL_TITLE_CHARACTERS = 28


def panel_title(text: str) -> str:
    """A panel's title, wrapped to the panel's width."""
    return textwrap.fill(text, PANEL_TITLE_CHARACTERS, break_long_words=False)


def latency_figure(models: dict[str, list[dict]], title: str, on_cpu: list[str] = ()):
    """latency.png's figure: a panel per model (own y scales: the ensemble is far slower), p50 to p99."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, max(len(models), 1), figsize=(4 * max(len(models), 1), 4.3), squeeze=False)
    if not models:
        _nothing_measured(panels[0][0])
    for panel, (model, rows) in zip(panels[0], models.items()):
        concurrency = [r["concurrency"] for r in rows]
        for percentile in ("p50", "p90", "p95", "p99"):
            panel.plot(concurrency, [r[f"{percentile}_us"] / 1000 for r in rows], marker=".", label=percentile)
        panel.set(xlabel="concurrency", xticks=concurrency)
        panel.set_title(panel_title(label(model, on_cpu)), fontsize="medium")
        panel.grid(alpha=0.3)
    panels[0][0].set_ylabel("latency (ms)")
    if models:
        panels[0][0].legend(fontsize="small")
    figure.suptitle(f"Latency percentiles vs concurrency{title}")
    figure.tight_layout()
    return figure


def _plots(
    results: Path, models: dict[str, list[dict]], title: str, on_cpu: list[str] = (), stamp: str = ""
) -> list[str]:
    """The report's figures, each as PNG and SVG, `stamp` (run, host, profile) on each; their PNG names."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    models = {model: rows for model, rows in models.items() if rows}
    figure = throughput_figure(models, title, on_cpu)
    _save(figure, results / "throughput.png", stamp)
    plt.close(figure)

    figure = latency_figure(models, title, on_cpu)
    _save(figure, results / "latency.png", stamp)
    plt.close(figure)
    plots = ["throughput.png", "latency.png"]
    if models:
        figure = throughput_vs_latency_figure(models, title, on_cpu)
        _save(figure, results / "throughput_vs_latency.png", stamp)
        plt.close(figure)
        plots.append("throughput_vs_latency.png")
    breakdown = _split_plot(results, models, title, plt, stamp)
    if breakdown:
        plots.append(breakdown)

    uuids = gpu_uuids(models)
    if uuids:
        labels = _gpu_labels(uuids)
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for model, rows in models.items():
            for uuid in uuids:
                points = [
                    (r["concurrency"], r["gpus"][uuid]["utilization"] * 100)
                    for r in rows
                    if "utilization" in r.get("gpus", {}).get(uuid, {})
                ]
                if points:
                    axes.plot(*zip(*points), marker="o", label=f"{model} {labels[uuid]}")
        levels = sorted({r["concurrency"] for rows in models.values() for r in rows if r.get("gpus")})
        axes.set(xlabel="concurrency", ylabel="GPU utilisation (%)", ylim=(0, 105), xticks=levels)
        axes.set_title(f"GPU utilisation vs concurrency{title}")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="x-small")
        figure.tight_layout()
        _save(figure, results / "gpu_utilization.png", stamp)
        plt.close(figure)
        plots.append("gpu_utilization.png")
    return plots


def _nothing_measured(axes) -> None:
    """An empty plot says why it is empty."""
    axes.text(0.5, 0.5, "no stable measurement", ha="center", va="center", transform=axes.transAxes, color="gray")


def _latency_split():
    """client_scripts/latency_split.py: the split's words and table, shared with the notebook (loaded when
    first used, so that the package imports where the project's scripts are not beside it)."""
    return client_script("latency_split")


def _split_table(rows: list[dict]) -> list[str]:
    """Where each level's average latency went, in ms (rows that perf_analyzer split)."""
    table = _latency_split().table(rows, "concurrency", "concurrency")
    return ["", "Where the average latency goes (ms):", "", *table] if table else []


def _split_plot(results: Path, models: dict[str, list[dict]], title: str, plt, stamp: str = "") -> str | None:
    """latency_breakdown.png: per model, a stacked bar per concurrency level of the average latency's parts."""
    models = {model: [r for r in rows if r.get("split_us")] for model, rows in models.items()}
    models = {model: rows for model, rows in models.items() if rows}
    if not models:
        return None
    figure, panels = plt.subplots(1, len(models), figsize=(4 * len(models), 4.5), squeeze=False)
    for panel, (model, rows) in zip(panels[0], models.items()):
        positions = range(len(rows))
        bottom = [0.0] * len(rows)
        for name, words in _latency_split().PARTS.items():
            heights = [r["split_us"].get(name, 0) / 1000 for r in rows]
            panel.bar(positions, heights, bottom=bottom, label=words)
            bottom = [b + h for b, h in zip(bottom, heights)]
        panel.set(xlabel="concurrency", xticks=list(positions), xticklabels=[r["concurrency"] for r in rows])
        panel.set_title(panel_title(model), fontsize="medium")
        panel.grid(alpha=0.3, axis="y")
    panels[0][0].set_ylabel("average latency (ms)")
    panels[0][-1].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.suptitle(f"Where the latency goes{title}")
    figure.tight_layout()
    _save(figure, results / "latency_breakdown.png", stamp)
    plt.close(figure)
    return "latency_breakdown.png"


def _gpu_table(rows: list[dict], labels: dict[str, str]) -> list[str]:
    """One line per concurrency and GPU; [] when the model's rows have no GPU metrics."""
    if not any(row.get("gpus") for row in rows):
        return []

    def cell(value, scale: float = 1.0, digits: int = 1) -> str:
        return "-" if value is None else f"{value * scale:.{digits}f}"

    lines = [
        "GPU metrics (Triton's, sampled by perf_analyzer during the measurement windows):",
        "",
        "| concurrency | GPU | utilisation % | memory used / total MiB | power W |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        for uuid, gpu in row.get("gpus", {}).items():
            memory = (
                f"{cell(gpu.get('memory_used_bytes'), 1 / MIB, 0)} / {cell(gpu.get('memory_total_bytes'), 1 / MIB, 0)}"
            )
            lines.append(
                f"| {row['concurrency']} | {labels[uuid]} | {cell(gpu.get('utilization'), 100)} | {memory} "
                f"| {cell(gpu.get('power_w'))} |"
            )
    return lines


def _gpu_metrics_line(summary: dict) -> str:
    uuids = summary["gpu_metrics"]["gpus"]
    if uuids:
        return f"- GPU metrics: {len(uuids)} GPU(s) ({', '.join(uuids)}), from Triton's metrics endpoint"
    if any("--collect-metrics" in command for command in summary["commands"].values()):
        return "- GPU metrics: none collected (perf_analyzer asked for them, but Triton reported no GPUs: a CPU host)"
    return "- GPU metrics: none collected (CPU host: perf_analyzer ran without --collect-metrics)"


def by_hand(command: str, host_results: Path) -> str:
    """The bench's perf_analyzer line as `fab perf` takes it, to paste as it is: the input the bench
    used (saved with the results), the deployed Triton filled in by fab perf, no CSV written."""
    words, kept, index = shlex.split(command), [], 0
    while index < len(words):
        word = words[index]
        if word in ("-u", "-f"):  # fab perf points -u at the deployed Triton; the CSV was the bench's
            index += 2
            continue
        kept += [word, str(host_results / "input.json")] if word == "--input-data" else [word]
        index += 2 if word == "--input-data" else 1
    return f"fab perf {shlex.quote(shlex.join(kept))}"


def _markdown(summary: dict, host_name: str, results: Path | None = None) -> str:
    """report.md: what ran where, the best configuration, a section per model, the P100 figures, the plots."""
    lines = _header(summary, host_name)
    labels = _gpu_labels(summary["gpu_metrics"]["gpus"])
    for model in summary["missing_levels"]:
        if model not in summary["models"]:
            lines += [f"## {model}", "", f"Not measured: {_unstable_line(summary, model, host_name)}", ""]
    for model, rows in summary["models"].items():
        lines += _model_section(summary, model, rows, labels, host_name, results)
    if summary["p100_comparison"]:
        lines += _p100_section(summary)
    lines += ["![throughput](throughput.png)", "", "![latency](latency.png)", ""]
    for plot, words in (
        ("throughput_vs_latency.png", "throughput against p99 latency"),
        ("latency_breakdown.png", "where the latency goes"),
        ("gpu_utilization.png", "GPU utilisation"),
    ):
        if plot in summary["plots"]:
            lines += [f"![{words}]({plot})", ""]
    return "\n".join(lines)


def _header(summary: dict, host_name: str) -> list[str]:
    """The report's title, its warnings (partial, smoke weights), what ran where and how, the best configuration."""
    lines = [f"# Benchmark {summary['run_id']}", ""]
    if summary.get("partial"):
        lines += [f"> **PARTIAL**: {_partial_line(summary['partial'])}", ""]
    if summary["smoke_weights"]:
        lines += [
            "> **SMOKE WEIGHTS**: the models ran with randomly initialised weights. Throughput and latency",
            "> are real; labels and captions are meaningless.",
            "",
        ]
    lines += _busy_warning(summary)
    facts, profile = summary["hosts"][host_name]["facts"], summary["profile"]
    gpus = ", ".join(g["name"] for g in facts.get("gpus", [])) or "none"
    windows = (
        f"windows of {profile['measurement_request_count']} requests)"
        if profile.get("measurement_mode") == "count_windows"
        else f"{profile['measurement_interval_ms']} ms windows)"
    )
    lines += [
        f"- target: {summary['target']}, host: {host_name} ({facts.get('cpu', {}).get('model', '?')}, "
        f"{facts.get('cpu', {}).get('cores', '?')} cores; GPUs: {gpus})",
        f"- Triton {facts.get('triton', {}).get('version')}, torch {facts.get('torch', {}).get('version')}, "
        f"Python {facts.get('python')}",
        f"- profile: {profile['name']} ("
        + (
            f"server scenario: Poisson arrivals, rates {profile['request_rate_range']} searched for p99 <= "
            f"{summary['server']['p99_ms']:g} ms, "
            if summary.get("scenario") == "server"
            else f"closed loop: concurrency {profile['concurrency_range']}, "
        )
        + windows,
        f"- input: {INPUT_ENCODING_WORDS.get(summary.get('input_encoding', 'base64'), summary.get('input_encoding'))}",
        f"- git commit: {summary['git']['commit']}{' (with uncommitted changes)' if summary['git']['dirty'] else ''}",
        _gpu_metrics_line(summary),
        "",
    ]
    best = summary.get("best")
    if best:
        lines += [
            f"**Best configuration**: `{label(best['model'], summary.get('ran_on_the_cpu', []))}` at concurrency "
            f"{best['concurrency']}: "
            f"{best['throughput']:.1f} infer/s (p95 {best['p95_us'] / 1000:.1f} ms).",
            "",
        ]
    return lines


def _load_line(summary: dict, model: str, host_name: str) -> list[str]:
    """The host's load as the model's measurement ended (none for runs from before it was recorded)."""
    load = (summary["hosts"][host_name].get("load") or {}).get(model)
    if not load:
        return []
    run_folder = run_folder_format()
    busy = " (**busy**: above its cores, the figures may be low)" if run_folder.busy(load) else ""
    return ["", f"Host load as the measurement ended: {run_folder.load_words(load)}{busy}."]


def _busy_warning(summary: dict) -> list[str]:
    """The warning over a report whose measurements ran on a busy host (run_folder.busy), naming them."""
    run_folder = run_folder_format()
    busy = run_folder.busy_measurements(summary)
    if not busy:
        return []
    several = len(summary.get("hosts", {})) > 1
    which = "; ".join(
        f"{model}{f' on {host}' if several else ''} ({run_folder.load_words(load)})" for host, model, load in busy
    )
    return [
        f"> **BUSY HOST**: measured under a load average above the host's cores: {which}. Processes waited",
        "> for a CPU while these were measured (perf_analyzer and Triton on the same cores count too): their",
        "> figures may be low. Measure again on a quieter host before comparing them.",
        "",
    ]


def _model_section(
    summary: dict, model: str, rows: list[dict], labels: dict, host_name: str, results: Path | None
) -> list[str]:
    """One model's section: its levels, where its latency goes, its GPUs, its perf_analyzer command."""
    missing = summary["missing_levels"].get(model, [])
    lines = [
        f"## {label(model, summary.get('ran_on_the_cpu', []))}",
        "",
        "| concurrency | infer/s | p50 ms | p90 ms | p95 ms | p99 ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    table = {r["concurrency"]: r for r in rows}
    for level in sorted({*table, *missing}):
        r = table.get(level)
        lines.append(
            f"| {level} | {r['throughput']:.1f} | {r['p50_us'] / 1000:.1f} | {r['p90_us'] / 1000:.1f} "
            f"| {r['p95_us'] / 1000:.1f} | {r['p99_us'] / 1000:.1f} |"
            if r
            else f"| {level} | no stable measurement | - | - | - | - |"
        )
    lines += _split_table(rows)
    gpu_table = _gpu_table(rows, labels)
    if gpu_table:
        lines += ["", *gpu_table]
    elif labels:  # other models of the run have them
        lines += ["", "GPU metrics: none for this model."]
    if missing:
        lines += ["", _unstable_line(summary, model, host_name)]
    lines += _load_line(summary, model, host_name)
    command = summary["commands"].get(model, "")
    lines += ["", f"perf_analyzer: `{command}`"]
    if command and results is not None:
        lines += [f"again by hand, from the project folder: `{by_hand(command, results / 'hosts' / host_name)}`"]
    return [*lines, ""]


def _p100_section(summary: dict) -> list[str]:
    """Our models beside the published P100 figures of the same configurations."""
    lines = [
        "## Beside the published P100 figures (serve-system-chi, 2 x P100)",
        "",
        "| config | concurrency | published infer/s | published avg latency ms | ours (model, infer/s at 8) |",
        "|---|---|---:|---:|---|",
    ]
    ours = {PUBLISHED_COUNTERPART[m]: m for m in summary["models"] if m in PUBLISHED_COUNTERPART}
    for config, concurrency, throughput, latency in PUBLISHED_P100:
        model = ours.get(config)
        at_8 = next((r["throughput"] for r in summary["models"].get(model, []) if r["concurrency"] == 8), None)
        mine = f"{model}: {at_8:.1f}" if model and at_8 is not None else "-"
        lines.append(f"| {config} | {concurrency} | {throughput} | {latency} | {mine} |")
    return [*lines, ""]


def write_report(
    results: Path,
    run_id: str,
    target: str,
    profile: dict,
    commands: dict[str, str],
    smoke_weights: bool,
    git: dict,
    input_encoding: str = "raw",
    partial: dict | None = None,
    server_p99_ms: float = 0,
) -> dict:
    """Read hosts/*/ and write summary.json, report.md and the plots; return the summary.

    `partial` ({"reason", "not_measured"}) marks a bench that stopped before
    its last model: summary.json keeps it, report.md and PARTIAL.md say it.
    server_p99_ms: the rows are the server scenario's (provision/server_report.py), searched for this bound.
    """
    hosts = {folder.name: _load_host(folder) for folder in sorted((results / "hosts").iterdir()) if folder.is_dir()}
    if not hosts:
        raise ValueError(f"no host results under {results / 'hosts'}")
    first = next(iter(hosts))
    models = hosts[first]["models"]
    summary = {
        "run_id": run_id,
        "target": target,
        "smoke_weights": smoke_weights,
        "profile": profile,
        "input_encoding": input_encoding,  # how perf_analyzer sent the image: "raw" (the file's bytes) or "base64"
        # which load made the figures: closed-loop concurrency, or the server scenario's Poisson arrivals
        "scenario": "server" if server_p99_ms else "closed_loop",
        "host": first,
        "models": models,  # of the first host; every host's are under "hosts"
        "hosts": hosts,
        "commands": commands,
        "git": git,
        "partial": partial,
        "p100_comparison": _has_p100(hosts[first]["facts"]),
        "ran_on_the_cpu": ran_on_the_cpu(list(models), hosts[first]["facts"]),
        # The metrics themselves are in the rows ("gpus"); this says whether there are any, and their units.
        "gpu_metrics": {"collected": bool(gpu_uuids(models)), "gpus": gpu_uuids(models), "units": GPU_UNITS},
    }
    title = " (SMOKE WEIGHTS)" if smoke_weights else ""
    stamp = f"run {run_id} · host {first} · {profile.get('name', '')} profile"
    if server_p99_ms:
        summary["server"] = server_report.summarize(
            results / "hosts" / first, models, server_p99_ms, profile["request_rate_range"], list(commands)
        )
        summary["plots"] = _server_plots(results, summary, title, stamp)
        text = _server_markdown(summary, first)
    else:
        summary["best"] = _best(models)
        summary["missing_levels"] = _missing_levels(models, profile, list(commands))
        summary["unstable"] = _unstable_reasons(results / "hosts" / first, list(commands))
        summary["plots"] = _plots(results, models, title, summary["ran_on_the_cpu"], stamp)
        text = _markdown(summary, first, results)
    run = RunFolder(results)
    run.write_summary(summary)
    (results / "report.md").write_text(text)
    if partial:
        run.mark_partial(_partial_line(partial))
    return summary


def _server_plots(results: Path, summary: dict, title: str, stamp: str) -> list[str]:
    """server_rates.png (and .svg): p99 against the offered rate, the bound drawn."""
    import matplotlib.pyplot as plt

    on_cpu = summary["ran_on_the_cpu"]
    labels = {model: label(model, on_cpu) for model in summary["models"]}
    figure = server_report.rate_figure(
        summary["models"], summary["server"]["p99_ms"], f"p99 latency under Poisson arrivals{title}", labels
    )
    if figure is None:
        return []
    _save(figure, results / "server_rates.png", stamp)
    plt.close(figure)
    return ["server_rates.png"]


def _server_markdown(summary: dict, host_name: str) -> str:
    """report.md of a server-scenario run: the header, a section per model, the plot."""
    lines = _header(summary, host_name)
    on_cpu = summary["ran_on_the_cpu"]
    for model in summary["server"]["models"]:
        command = summary["commands"].get(model, "")
        rows = summary["models"].get(model, [])
        lines += server_report.section(model, rows, summary["server"], command, label(model, on_cpu))
        if load_line := _load_line(summary, model, host_name):
            lines[-1:-1] = load_line  # before the section's closing blank line
    if summary["plots"]:
        lines += ["![p99 against the offered rate](server_rates.png)", ""]
    return "\n".join(lines)


def _unstable_line(summary: dict, model: str, host_name: str) -> str:
    """Which levels of a model have no stable measurement, and perf_analyzer's own reason."""
    levels = ", ".join(str(level) for level in summary["missing_levels"][model])
    reason = summary.get("unstable", {}).get(model)
    return (
        f"no stable measurement at concurrency {levels}"
        + (f' (perf_analyzer: "{reason}")' if reason else "")
        + f"; see hosts/{host_name}/{model}.log. Longer windows or more trials (lab.bench.<profile>: "
        "docs/configuration.md) or a quieter host help."
    )


def _partial_line(partial: dict) -> str:
    not_measured = ", ".join(partial.get("not_measured") or []) or "none"
    return f"The bench stopped early ({partial['reason']}); not measured: {not_measured}."
