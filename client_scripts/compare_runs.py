"""Two or more `fab bench` runs side by side: what differs between them, then their figures.

Used by `fab compare RUN_A RUN_B` (which writes compare.md and compare.png)
and by profiling.ipynb (which runs beside this file). Standard library, and
matplotlib for the plot only.

The first run is the baseline: every other run's throughput, p95 and p99 are
given as a ratio to it, for every model and concurrency that all the runs
measured. A regression is a throughput that fell, or a p99 that rose, by more
than the threshold (10 % unless told): the full profile's own noise, since
perf_analyzer accepts a concurrency level there once its last three windows
agree within 10 % (stability_percentage). Quick-profile runs accept any
windows, so their flags are indicative only, and the report says so.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import run_folder  # beside this file: the results folder's format

DEFAULT_THRESHOLD = 0.10
SUMMARY_KEYS = ("run_id", "models", "hosts", "profile")  # what every summary.json of `fab bench` holds


class CompareError(ValueError):
    """The runs cannot be compared; str(error) says why."""


# --------------------------------------------------------------------------- loading


def load_run(path: Path) -> dict:
    """A run's summary.json, with "path" added; CompareError for anything that is not a complete run."""
    try:
        summary = run_folder.read_summary(path)
    except run_folder.NotARun as error:
        raise CompareError(str(error)) from None
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise CompareError(
            f"{Path(path) / run_folder.SUMMARY} has no {', '.join(missing)}: not a summary written by `fab bench`"
        )
    if not any(summary["models"].values()):
        raise CompareError(f"{path}: the run measured nothing (no model has a row)")
    return {**summary, "path": str(path)}


def load_runs(paths: list[Path]) -> list[dict]:
    """Every run, checked: at least two, no folder twice, and a model and concurrency they all measured."""
    if len(paths) < 2:
        raise CompareError("compare needs at least two runs")
    resolved = [Path(p).resolve() for p in paths]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise CompareError(f"the same run given twice: {', '.join(twice)}")
    runs = [load_run(path) for path in paths]
    check_one_scenario(runs)
    if not side_by_side(runs):
        models = "; ".join(f"{run['run_id']}: {', '.join(sorted(run['models']))}" for run in runs)
        raise CompareError(f"the runs have no model and concurrency in common ({models})")
    return runs


def check_one_scenario(runs: list[dict]) -> None:
    """CompareError unless every run measured the closed-loop scenario (fab bench --scenario): a throughput
    at a concurrency and a rate sustained within a p99 bound are different figures, not one to set beside
    the other."""
    scenarios = {run["run_id"]: run.get("scenario") or "closed_loop" for run in runs}  # as run_folder.scenario reads it
    if len(set(scenarios.values())) > 1:
        which = ", ".join(f"{run_id}: {scenario}" for run_id, scenario in scenarios.items())
        raise CompareError(
            f"the runs measured different scenarios ({which}): closed-loop figures (throughput at each concurrency) "
            "and the server scenario's (the Poisson rate sustained within a p99 bound) are not the same figure; "
            "compare runs of one scenario"
        )
    if set(scenarios.values()) == {"server"}:
        raise CompareError(
            "fab compare sets closed-loop runs side by side, concurrency by concurrency; a server-scenario run has "
            "one sustained rate per model: its report.md and summary.json's server part give it"
        )


# --------------------------------------------------------------------------- what differs


def _first_host(run: dict) -> dict:
    return run["hosts"].get(run.get("host")) or next(iter(run["hosts"].values()), {})


def facts(run: dict) -> dict[str, str]:
    """What a run was made with, as text, one entry per thing that may differ between runs."""
    host = _first_host(run).get("facts", {})
    profile = run.get("profile", {})
    git = run.get("git") or {}
    gpus = host.get("gpus") or []
    torch = host.get("torch") or {}
    windows = (
        f"windows of {profile.get('measurement_request_count')} requests"
        if profile.get("measurement_mode") == "count_windows"
        else f"{profile.get('measurement_interval_ms')} ms windows"
    )
    return {
        "git commit": (git.get("commit") or "unknown") + (" (with uncommitted changes)" if git.get("dirty") else ""),
        "target": str(run.get("target")),
        "site": str(run.get("site") or host.get("site") or "-"),
        "hosts": ", ".join(sorted(run["hosts"])),
        "CPU": f"{host.get('cpu', {}).get('model', '?')} ({host.get('cpu', {}).get('cores', '?')} cores)",
        "GPUs": ", ".join(g.get("name", "?") for g in gpus) or "none",
        "GPU driver": ", ".join(sorted({str(g.get("driver")) for g in gpus if g.get("driver")})) or "-",
        "Triton": str((host.get("triton") or {}).get("version")),
        "torch": str(torch.get("version")),
        "CUDA (torch)": str(torch.get("cuda") or "-"),
        "Python": str(host.get("python")),
        "weights": "smoke (random)" if run.get("smoke_weights") else "real",
        "profile": f"{profile.get('name')} (concurrency {profile.get('concurrency_range')}, {windows}, "
        f"stability {profile.get('stability_percentage', '?')} %)",
        "input": str(run.get("input_encoding", "base64")),
        # A bench that stopped early (the lease's end, a failure, Ctrl-C): its missing models are not a regression.
        "complete": (
            f"partial ({run['partial'].get('reason', 'stopped early')}; not measured: "
            f"{', '.join(run['partial'].get('not_measured') or []) or 'none'})"
            if run.get("partial")
            else "complete"
        ),
    }


def differing_facts(runs: list[dict]) -> dict[str, list[str]]:
    """The facts whose value is not the same in every run: {name: [value in each run]}."""
    every = [facts(run) for run in runs]
    return {name: [f[name] for f in every] for name in every[0] if len({f[name] for f in every}) > 1}


def deployed_configs(run: dict) -> dict[str, str]:
    """{model: config.pbtxt text} as deployed on the run's first host (hosts/<host>/configs/)."""
    folder = Path(run["path"]) / "hosts" / (run.get("host") or next(iter(run["hosts"]), "")) / "configs"
    return {path.stem: path.read_text() for path in sorted(folder.glob("*.pbtxt"))} if folder.is_dir() else {}


def config_diffs(runs: list[dict]) -> dict[str, str]:
    """{"<run id>: <model>": unified diff from the baseline's config}, for every deployed config that changed."""
    base = deployed_configs(runs[0])
    diffs = {}
    for run in runs[1:]:
        configs = deployed_configs(run)
        for model in sorted(set(base) | set(configs)):
            before, after = base.get(model, ""), configs.get(model, "")
            if before != after:
                lines = difflib.unified_diff(
                    before.splitlines(),
                    after.splitlines(),
                    f"{runs[0]['run_id']}/{model}",
                    f"{run['run_id']}/{model}",
                    lineterm="",
                    n=1,
                )
                diffs[f"{run['run_id']}: {model}"] = "\n".join(lines)
    return diffs


# --------------------------------------------------------------------------- the figures


def side_by_side(runs: list[dict]) -> list[dict]:
    """One row per model and concurrency that every run measured: each run's figures, in run order."""
    rows = []
    for model in runs[0]["models"]:
        by_level = [{row["concurrency"]: row for row in run["models"].get(model, [])} for run in runs]
        for level in sorted(set.intersection(*(set(levels) for levels in by_level))):
            measured = [levels[level] for levels in by_level]
            rows.append(
                {
                    "model": model,
                    "concurrency": level,
                    "throughput": [m["throughput"] for m in measured],
                    "p95_us": [m.get("p95_us") for m in measured],
                    "p99_us": [m.get("p99_us") for m in measured],
                    "split_us": [m.get("split_us") or {} for m in measured],  # where each run's average went
                }
            )
    return rows


def split_changes(runs: list[dict], rows: list[dict]) -> list[dict]:
    """For each later run and row both runs split: which part of the average latency changed most from
    run A's, in microseconds (the part that grew, when the average grew)."""
    found = []
    for row in rows:
        base = row["split_us"][0]
        for index, run in enumerate(runs[1:], start=1):
            later = row["split_us"][index]
            common = [part for part in base if part in later]
            if not common:
                continue
            change = {part: later[part] - base[part] for part in common}
            part = max(change, key=lambda name: abs(change[name]))
            found.append(
                {"run": run["run_id"], **_where(row), "part": part, "change_us": change[part],
                 "average_change_us": sum(later[p] for p in common) - sum(base[p] for p in common)}
            )  # fmt: skip
    return found


def _ratio(value, base) -> float | None:
    return None if value is None or not base else value / base


def regressions(runs: list[dict], rows: list[dict], threshold: float = DEFAULT_THRESHOLD) -> list[dict]:
    """Every figure of a later run worse than the baseline's by more than the threshold."""
    found = []
    busy_models = {(b["run"], b["model"]) for b in busy(runs)}
    for row in rows:
        for index, run in enumerate(runs[1:], start=1):
            throughput = _ratio(row["throughput"][index], row["throughput"][0])
            p99 = _ratio(row["p99_us"][index], row["p99_us"][0])
            # Measured on a busy host, in this run or the baseline: the load may explain it.
            under_load = {(run["run_id"], row["model"]), (runs[0]["run_id"], row["model"])} & busy_models
            where = {"run": run["run_id"], **_where(row), "busy_host": bool(under_load)}
            if throughput is not None and throughput < 1 - threshold:
                found.append({**where, "figure": "throughput", "ratio": throughput})
            if p99 is not None and p99 > 1 + threshold:
                found.append({**where, "figure": "p99 latency", "ratio": p99})
    return found


def busy(runs: list[dict]) -> list[dict]:
    """Every measurement of the runs that ran on a busy host (run_folder.busy: a load average above the
    host's cores as it ended): {"run", "host", "model", "load"}. A difference there may be the load."""
    return [
        {"run": run["run_id"], "host": host, "model": model, "load": load}
        for run in runs
        for host, model, load in run_folder.busy_measurements(run)
    ]


def _where(row: dict) -> dict:
    return {"model": row["model"], "concurrency": row["concurrency"]}


# --------------------------------------------------------------------------- the report


def _ms(microseconds) -> str:
    return "-" if microseconds is None else f"{microseconds / 1000:.1f}"


def _x(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def figures_table(runs: list[dict], rows: list[dict]) -> str:
    """The markdown table: per row, each run's infer/s, p95 and p99, and the later runs' ratios to the first."""
    names = [chr(ord("A") + i) for i in range(len(runs))]
    header = ["model", "concurrency"]
    for index, name in enumerate(names):
        header += [f"{name} infer/s"] + ([f"{name}/A"] if index else [])
    for name in names:
        header += [f"{name} p95 ms"]
    for index, name in enumerate(names):
        header += [f"{name} p99 ms"] + ([f"{name}/A"] if index else [])
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in rows:
        cells = [row["model"], str(row["concurrency"])]
        for index in range(len(runs)):
            cells.append(f"{row['throughput'][index]:.1f}")
            if index:
                cells.append(_x(_ratio(row["throughput"][index], row["throughput"][0])))
        cells += [_ms(value) for value in row["p95_us"]]
        for index in range(len(runs)):
            cells.append(_ms(row["p99_us"][index]))
            if index:
                cells.append(_x(_ratio(row["p99_us"][index], row["p99_us"][0])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(runs: list[dict], threshold: float = DEFAULT_THRESHOLD, plot: str | None = None) -> str:
    """compare.md: the runs, what differs, the figures side by side, the regressions."""
    names = [chr(ord("A") + i) for i in range(len(runs))]
    rows = side_by_side(runs)
    lines = ["# Benchmark runs compared", ""]
    lines += [f"- **{name}** `{run['run_id']}` ({run['path']})" for name, run in zip(names, runs)]
    lines += _busy_lines(runs, names)
    lines += ["", "## What differs", ""]
    differing = differing_facts(runs)
    if differing:
        lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(runs)]
        lines += [f"| {fact} | " + " | ".join(values) + " |" for fact, values in differing.items()]
    else:
        lines.append("Commit, versions, hardware, weights and profile: the same in every run.")
    diffs = config_diffs(runs)
    lines += ["", "Deployed model configs:" if diffs else "Deployed model configs: the same in every run."]
    for name, diff in diffs.items():
        lines += ["", f"`{name}`", "", "```diff", diff, "```"]
    only = sorted({m for run in runs for m in run["models"]} - {row["model"] for row in rows})
    lines += ["", "## Figures", ""]
    lines.append(
        "For every model and concurrency all the runs measured; ratios are to run A "
        "(throughput: higher is better; latency: lower is better)."
    )
    lines += ["", figures_table(runs, rows), ""]
    if only:
        lines += [f"Not measured by every run (left out): {', '.join(only)}", ""]
    if plot:
        lines += [f"![throughput and p99 of every run]({plot})", ""]
    changes = split_changes(runs, rows)
    if changes:
        lines += ["## Where the latency changed", ""]
        lines.append("Per model and concurrency, the part of the average latency that changed most against run A (ms).")
        lines += ["", "| run | model | concurrency | average change | most changed part | its change |",
                  "|---|---|---:|---:|---|---:|"]  # fmt: skip
        lines += [
            f"| {c['run']} | {c['model']} | {c['concurrency']} | {c['average_change_us'] / 1000:+.2f} "
            f"| {c['part'].replace('_', ' ')} | {c['change_us'] / 1000:+.2f} |"
            for c in changes
        ]
        lines.append("")
    found = regressions(runs, rows, threshold)
    quick = quick_runs(runs)
    lines += ["## Regressions", ""]
    lines.append(
        f"Threshold: throughput down, or p99 up, by more than {threshold:.0%} against run A "
        "(the full profile's noise: perf_analyzer accepts a level when its last three windows agree within 10 %)."
    )
    if quick:
        lines.append(f"Quick-profile runs ({', '.join(quick)}) accept any windows: their flags are indicative only.")
    lines.append("")
    if found:
        lines += ["| run | model | concurrency | figure | ratio to A | busy host |", "|---|---|---:|---|---:|---|"]
        lines += [
            f"| {f['run']} | {f['model']} | {f['concurrency']} | {f['figure']} | {f['ratio']:.2f}x "
            f"| {'**yes**: may be the load' if f['busy_host'] else 'no'} |"
            for f in found
        ]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def _busy_lines(runs: list[dict], names: list[str]) -> list[str]:
    """The warning under the runs' list: which measurements ran on a busy host (busy())."""
    found = busy(runs)
    if not found:
        return []
    name_of = {run["run_id"]: name for name, run in zip(names, runs)}
    which = "; ".join(
        f"{name_of[b['run']]}: {b['model']} on {b['host']} ({run_folder.load_words(b['load'])})" for b in found
    )
    return [
        "",
        f"> **BUSY HOST**: measured under a load average above the host's cores: {which}. Their figures may",
        "> be low because of the load, not of what changed between the runs.",
    ]


def quick_runs(runs: list[dict]) -> list[str]:
    """The ids of the runs measured with the quick profile (any windows accepted: their flags are indicative)."""
    return [run["run_id"] for run in runs if (run.get("profile") or {}).get("name") == "quick"]


def plot(runs: list[dict], path: Path) -> Path:
    """compare.png: figure() saved."""
    figure(runs).savefig(path, dpi=100)
    return path


def figure(runs: list[dict]):
    """compare.png's figure: throughput and p99 against concurrency, one panel each, a line per model and run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no backend to choose, in a notebook or not

    figure = Figure(figsize=(13, 4.5))
    FigureCanvasAgg(figure)  # a canvas that can lay it out (tight_layout) and draw it
    left, right = figure.subplots(1, 2)
    levels_measured = set()
    models = sorted({m for run in runs for m in run["models"]})
    styles = ["-", "--", ":", "-."]
    for index, run in enumerate(runs):
        for color, model in enumerate(models):
            measured = run["models"].get(model) or []
            if not measured:
                continue
            levels = [row["concurrency"] for row in measured]
            levels_measured.update(levels)
            style = dict(color=f"C{color}", linestyle=styles[index % len(styles)], marker="o")
            label = f"{chr(ord('A') + index)}: {model}"
            left.plot(levels, [row["throughput"] for row in measured], label=label, **style)
            right.plot(levels, [(row.get("p99_us") or 0) / 1000 for row in measured], label=label, **style)
    left.set(xlabel="concurrency", ylabel="throughput (infer/s)", title="throughput")
    right.set(xlabel="concurrency", ylabel="p99 latency (ms)", title="p99 latency")
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.set_xticks(sorted(levels_measured))  # the levels measured: whole numbers, never 1.5
    right.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the lines, not over them
    figure.tight_layout()
    return figure


def write(runs: list[dict], out: Path, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """compare.md and compare.png in `out`; returns {"markdown", "regressions", "rows", "split_changes", "busy"}."""
    out.mkdir(parents=True, exist_ok=True)
    plot(runs, out / "compare.png")
    text = markdown(runs, threshold, plot="compare.png")
    (out / "compare.md").write_text(text)
    rows = side_by_side(runs)
    return {
        "markdown": text,
        "rows": rows,
        "regressions": regressions(runs, rows, threshold),
        "split_changes": split_changes(runs, rows),
        "busy": busy(runs),
    }
