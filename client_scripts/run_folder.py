"""A results/<run-id>/ folder as `fab bench` and `fab tune` write it: the names of its parts, and how to read it.

    results/
      <run-id>/           one run; its id starts with its time, so the ids sort as the runs happened
        summary.json      a bench's figures (a tune writes tune/best.json instead)
        report.md         what a reader opens first
        PARTIAL.md        only where the run stopped early: why, and what was not measured
        input.jpg         the image perf_analyzer's input was made from
        hosts/<host>/     what each host sent back: perf_analyzer's CSVs and logs, host.json, configs/
        tune/             a tune's candidates.csv, best.json and pareto.png
      compare/            `fab compare`'s comparisons, not runs

Standard library only: the controller (provision/measure.py, which also writes
runs), compare_runs.py and profiling.ipynb all read runs through this module.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

SUMMARY = "summary.json"
REPORT = "report.md"
PARTIAL = "PARTIAL.md"
INPUT_IMAGE = "input.jpg"
HOSTS = "hosts"
CONFIGS = "configs"
TUNE = "tune"
TUNE_SUMMARY = "tune/best.json"
COMPARISONS = "compare"  # results/compare/: comparisons, not runs


class NotARun(ValueError):
    """The folder is not a finished run of `fab bench`; str(error) says why."""


def new_id(target: str, kind: str = "") -> str:
    """A new run's id: its time (so that ids sort as the runs happened), its target, its kind ("tune")."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{target}" + (f"-{kind}" if kind else "")


def host_folder(run: Path, host: str) -> Path:
    """Where one host's results of the run are."""
    return Path(run) / HOSTS / host


def configs_folder(run: Path, host: str) -> Path:
    """The model configurations the host had deployed while the run measured it."""
    return host_folder(run, host) / CONFIGS


def is_run(path: Path) -> bool:
    """A folder under results/ that holds a run (finished or not): any but compare/."""
    return Path(path).is_dir() and Path(path).name != COMPARISONS


def runs(root: Path) -> list[Path]:
    """The runs under a results folder, oldest first."""
    root = Path(root)
    return sorted(path for path in root.iterdir() if is_run(path)) if root.is_dir() else []


def is_partial(run: Path) -> bool:
    """The run stopped early (PARTIAL.md says why)."""
    return (Path(run) / PARTIAL).is_file()


def is_complete(run: Path) -> bool:
    """The run wrote its summary (a bench's summary.json, a tune's best.json) and did not stop early."""
    run = Path(run)
    return ((run / SUMMARY).is_file() or (run / TUNE_SUMMARY).is_file()) and not is_partial(run)


def bench_runs(root: Path) -> list[Path]:
    """The runs of `fab bench` that wrote a summary (partial ones too: they say so), oldest first."""
    return [run for run in runs(root) if (run / SUMMARY).is_file()]


def read_summary(run: Path) -> dict:
    """A bench run's summary.json; NotARun for a folder that is not one, or a summary that cannot be read."""
    run = Path(run)
    summary_file = run / SUMMARY
    if not run.is_dir():
        raise NotARun(f"{run}: no such run folder")
    if not summary_file.is_file():
        raise NotARun(f"{run}: no {SUMMARY}: not a results/<run-id>/ folder, or a bench that did not finish")
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError) as error:
        raise NotARun(f"{summary_file}: unreadable ({error})") from None
    if not isinstance(summary, dict):
        raise NotARun(f"{summary_file}: not a summary written by `fab bench`")
    return summary


def scenario(run: Path) -> str:
    """The scenario a bench run measured: "closed_loop" (runs from before it was recorded too) or "server"."""
    return read_summary(run).get("scenario") or "closed_loop"


def busy(load: dict | None) -> bool:
    """A measurement ran on a busy host: the 1-minute load average as it ended was above the host's cores
    (processes waited for a CPU; the figures may be low). `load`: {"load_average", "cores"}, or None."""
    return bool(load) and load["load_average"] > load["cores"]


def busy_measurements(summary: dict) -> list[tuple[str, str, dict]]:
    """(host, model, load) of each measurement of a bench run that ran on a busy host (busy()); the load
    each measurement ended under is in summary["hosts"][host]["load"][model] (runs before it: none)."""
    return [
        (host, model, load)
        for host, results in sorted(summary.get("hosts", {}).items())
        for model, load in (results.get("load") or {}).items()
        if busy(load)
    ]


def load_words(load: dict) -> str:
    """A measurement's load, in words."""
    return f"load average {load['load_average']:.2f} on {load['cores']} cores"
