"""fab tune: the serving settings of one model that give the most throughput under a p99 latency budget.

The search runs against the deployed Triton on the (first) host, through the
same pieces as fab deploy and fab bench:

- a candidate is the model's template (model_repository/<model>/config.pbtxt.j2)
  rendered with other values for the settings its `tuning(...)` call declares
  (provision.model_repo): instance count, max_batch_size, preferred batch
  sizes, queue delay, GPUs;
- playbooks/tune.yml writes it over the deployed config.pbtxt, loads it into the
  running server (explicit model control: the other models keep serving, nothing
  restarts), and measures it with bench.yml's perf_analyzer run;
- the deployed config is fetched before the first candidate and put back (and
  loaded) at the end, whatever happened in between.

The search is greedy, one setting at a time, in DIMENSIONS' order: from the
deployed settings (measured first), try the setting's values in ascending order
and stop growing it as soon as a value breaks the budget or does not raise the
throughput by MIN_GAIN; keep the setting's best value and go on to the next.
A candidate's score is its highest throughput at a concurrency whose p99 is
within the budget; with --scenario server, the highest Poisson arrival rate
whose p99 is within it (perf_analyzer's binary search: provision/server_report.py).
How many configurations that measured out of the full grid
is in the report.

Triton Model Analyzer (triton-model-analyzer 1.46.0, tried against this Triton
2.51) is not used: its remote mode profiles only the config the server already
has, and its local mode starts a server of its own per configuration and writes
the configs itself, not from our templates (docs/tune.md).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from provision import interrupts
from provision import state as state_module
from provision.ansible import PlaybookError, PlaybookInterrupted, run_playbook
from provision.errors import OperationError
from provision.measure import Measurement, RunFolder, failure_reason, git_commit, lease_for, playbook_run
from provision.model_repo import RenderValues, model_names, render_config, tunable_settings
from provision.perf import concurrency_levels, fresh_csv, parse_csv, unstable_reason

# The order in which the settings are searched: the ones that decide the most first.
DIMENSIONS = ("instance_count", "max_batch_size", "preferred_batch_size", "max_queue_delay_us", "gpus")
# The values tried, in ascending order (preferred_batch_size: derived from max_batch_size).
VALUES = {
    "full": {
        "instance_count": [1, 2, 3, 4],
        "max_batch_size": [1, 2, 4, 8, 16, 32],
        "max_queue_delay_us": [0, 100, 500, 1000, 5000],
    },
    "quick": {
        "instance_count": [1, 2],
        "max_batch_size": [4, 8, 16],
        "max_queue_delay_us": [100, 1000],
    },
}
# A larger value is kept only if it raises the throughput by this much (the rest is noise).
MIN_GAIN = 0.05
CLOSEST_MISSES = 3
CSV_FIELDS = [
    "candidate", "instance_count", "max_batch_size", "preferred_batch_size", "max_queue_delay_us", "gpus",
    "meets_budget", "concurrency", "request_rate", "throughput", "p50_ms", "p95_ms", "p99_ms", "gpu_utilization",
    "gpu_memory_mb",
]  # fmt: skip


class TuneError(OperationError):
    """The tune cannot start or found nothing within the budget; the message says what to do."""


@dataclass
class Candidate:
    """One configuration of the model and what perf_analyzer measured at each concurrency."""

    number: int
    settings: dict
    rows: list[dict] = field(default_factory=list)
    error: str = ""  # why it was not measured (Triton refused the config, no stable measurement)

    def within(self, budget_ms: float) -> list[dict]:
        return [row for row in self.rows if row["p99_us"] <= budget_ms * 1000]

    def best_row(self, budget_ms: float) -> dict | None:
        """The row worth the most within the budget (worth()); None: none is within it."""
        return max(self.within(budget_ms), key=worth, default=None)

    def score(self, budget_ms: float) -> float:
        row = self.best_row(budget_ms)
        return worth(row) if row else 0.0

    def closest_row(self) -> dict | None:
        """The concurrency with the lowest p99 (for a candidate that misses the budget)."""
        return min(self.rows, key=lambda row: row["p99_us"], default=None)

    def reported_row(self, budget_ms: float) -> dict | None:
        """The row that stands for the candidate: its best within the budget, else its closest miss."""
        return self.best_row(budget_ms) or self.closest_row()

    def describe(self, budget_ms: float) -> str:
        row = self.reported_row(budget_ms)
        figures = f"{worth_words(row)}, p99 {row['p99_us'] / 1000:.1f} ms at {load(row)}" if row else f"not measured: {self.error}"
        return f"{format_settings(self.settings)}: {figures}"


def worth(row: dict) -> float:
    """What a configuration is worth at one row: the Poisson rate it sustained (the server scenario's rows),
    else the throughput of the closed loop."""
    return row["request_rate"] if "request_rate" in row else row["throughput"]


def worth_words(row: dict) -> str:
    if "request_rate" in row:
        return f"{row['request_rate']:g} requests/s sustained ({row['throughput']:.1f} infer/s answered)"
    return f"{row['throughput']:.1f} infer/s"


def load(row: dict) -> str:
    """The load a row was measured under, in words."""
    return f"{row['request_rate']:g} requests/s (Poisson)" if "request_rate" in row else f"concurrency {row['concurrency']}"


def format_settings(settings: dict) -> str:
    return ", ".join(f"{name} {value}" for name, value in settings.items())


def grid_size(baseline: dict, values: dict, gpu_count: int) -> int:
    """How many configurations a full grid over the same values would measure."""
    size = 1
    for name in DIMENSIONS:
        size *= len(values_to_try(name, baseline, values, gpu_count)) or 1
    return size


def values_to_try(name: str, current: dict, values: dict, gpu_count: int) -> list:
    """The values of one setting, ascending; [] where the model or the host has no such setting to vary."""
    if name not in current:
        return []
    if name == "gpus":
        return list(range(1, gpu_count + 1)) if gpu_count > 1 else []
    if name == "preferred_batch_size":
        # Triton reads no preferred size as [max_batch_size]: those two are one configuration.
        largest = current["max_batch_size"]
        return [[largest], [largest // 2, largest]] if largest >= 4 else [[largest]]
    return values[name]


def with_setting(settings: dict, name: str, value) -> dict:
    """settings with one setting changed; preferred sizes above a smaller max_batch_size are dropped."""
    changed = {**settings, name: value}
    if name == "max_batch_size" and "preferred_batch_size" in changed:
        changed["preferred_batch_size"] = [size for size in changed["preferred_batch_size"] if size <= value]
    return changed


def search(
    measure: Callable[[dict], Candidate], baseline: dict, budget_ms: float, values: dict, gpu_count: int
) -> tuple[list[Candidate], Candidate]:
    """The greedy search (module docstring): (every candidate measured, in order; the one it settled on).

    Along each setting a larger value is kept only when it raises the throughput
    within the budget by MIN_GAIN: a value that gains less, or breaks the budget,
    ends that setting. The settled candidate may still miss the budget (score 0)
    when every candidate does.
    """
    measured: list[Candidate] = []

    def candidate(settings: dict) -> Candidate:
        for seen in measured:
            if seen.settings == settings:
                return seen
        measured.append(measure(settings))
        return measured[-1]

    current = candidate(baseline)
    for name in DIMENSIONS:
        kept = None
        for value in values_to_try(name, current.settings, values, gpu_count):
            tried = candidate(with_setting(current.settings, name, value))
            if kept is not None and (
                not tried.within(budget_ms) or tried.score(budget_ms) < kept.score(budget_ms) * (1 + MIN_GAIN)
            ):
                break  # growing this setting broke the budget or stopped paying
            kept = tried
        if kept is not None and kept.score(budget_ms) >= current.score(budget_ms):
            current = kept
    return measured, current


# --------------------------------------------------------------------------- on the host


@dataclass
class Tune:
    """One fab tune: its host, its run folder and the playbook variables every step shares."""

    settings: dict
    state: state_module.State
    model: str
    perf_profile: dict  # the bench profile's perf_analyzer settings, with the tune's concurrency range
    server_p99_ms: float = 0  # the server scenario: each candidate's highest Poisson rate within this p99

    def __post_init__(self):
        self.host = self.state.hosts[0].name
        self.run = RunFolder.create(self.settings, self.state.target, [], kind="tune")
        self.results = self.run.path
        self.folder = self.results / "tune"
        self.folder.mkdir()
        measurement = Measurement(self.settings, self.state, self.run, hosts=[self.host])
        (self.perf_run,) = measurement.perf_runs_of([self.model], self.perf_profile, self.server_p99_ms)[self.host]
        self.common = {
            **measurement.playbook_vars(),
            "lab_tune_model": self.model,
            "lab_tune_deployed": str(self.folder / "deployed.pbtxt"),
        }

    def load_words(self) -> str:
        """The load each candidate is measured under, in words."""
        if self.server_p99_ms:
            return f"server scenario: Poisson arrivals, rates {self.perf_profile['request_rate_range']} searched"
        return f"concurrency {self.perf_profile['concurrency_range']}"

    def playbook(self, results_dir: Path, **variables) -> None:
        """One step of the tune, its results (as bench.yml writes a run's) under results_dir."""
        RunFolder(results_dir).configs(self.host).mkdir(parents=True, exist_ok=True)
        # One line per candidate is the tune's progress: the playbook's task lines are in its log.
        variables = {**self.common, "lab_results_dir": str(results_dir), **variables}
        run_playbook("tune.yml", variables, lambda line: None, limit=self.host)

    def fetch_deployed(self) -> str:
        """The deployed config.pbtxt (kept to be put back), and the bench folder made ready."""
        self.playbook(
            self.folder / "measurements" / "deployed",
            lab_tune_save_deployed=True,
            lab_bench_runs={},
            lab_bench_finish=False,
        )
        return (self.folder / "deployed.pbtxt").read_text()

    def measure(self, number: int, config_text: str) -> list[dict]:
        """Load one candidate and measure it; its perf_analyzer rows (TuneError: no stable measurement)."""
        results = self.folder / "measurements" / f"{number:02d}"
        measurement = f"{self.run.id}/{self.model}/{number:02d}"
        self.playbook(
            results,
            lab_tune_config=config_text,
            lab_bench_runs={self.host: [playbook_run(self.perf_run, measurement)]},
            lab_bench_prepare=False,
            lab_bench_finish=False,
        )
        host = RunFolder(results).host(self.host)
        csv_file = fresh_csv(host / f"{self.model}.csv", host / f"{self.model}.log", measurement)
        if csv_file is None:
            log = host / f"{self.model}.log"
            reason = unstable_reason(log.read_text(errors="replace")) if log.exists() else None
            first = (
                f"any rate of {self.perf_profile['request_rate_range']}"
                if self.server_p99_ms
                else f"concurrency {concurrency_levels(self.perf_profile['concurrency_range'])[0]}"
            )
            raise TuneError(
                f"no stable measurement at {first}"
                + (f' (perf_analyzer: "{reason}")' if reason else f" (perf_analyzer's log: {log})")
            )
        return parse_csv(csv_file)

    def restore(self, deployed_text: str) -> None:
        """Put the deployed config back, load it, end the bench on the host (its folder removed)."""
        self.playbook(
            self.folder / "measurements" / "restored",
            lab_tune_config=deployed_text,
            lab_bench_runs={},
            lab_bench_prepare=False,
        )


def deployed_values(deployed_text: str, gpu_count: int, settings: dict, smoke: bool) -> RenderValues:
    """The render values of the deployed config: its weight paths as the host sees them, the current settings."""

    def parameter(key: str) -> str:
        found = re.search(rf'key: "{key}" value {{ string_value: "([^"]*)" }}', deployed_text)
        return found.group(1) if found else ""

    return RenderValues.from_settings(
        gpu_count, parameter("weights_path"), parameter("blip_source"), settings, smoke=smoke
    )


def check_request(model: str, settings: dict, state: state_module.State, batch_sizes: list[int] | None) -> None:
    """TuneError for a request that cannot be tuned: nothing deployed, an unknown model, one without settings."""
    if state.deploy.get("status") != "deployed":
        raise TuneError("nothing is deployed: run `fab deploy` first")
    names = model_names()
    if model not in names:
        raise TuneError(f"no model {model!r}: the models are {', '.join(names)}")
    values = RenderValues.from_settings(0, "/weights", "blip", settings, smoke=False)
    tunable = tunable_settings(model, values)
    if tunable is None:
        raise TuneError(f"{model} has no serving settings of its own to tune (tune the models it calls)")
    if batch_sizes and "max_batch_size" not in tunable:
        raise TuneError(
            f"{model} has no dynamic batching (max_batch_size 1): it takes {', '.join(tunable)} only; "
            "its batching variant is batching_food_classifier"
        )


def tune(
    settings: dict,
    state: state_module.State,
    model: str,
    p99_ms: float,
    quick: bool = False,
    max_gpus: int | None = None,
    concurrency: str = "",
    batch_sizes: list[int] | None = None,
    say: Callable[[str], None] = print,
    server: bool = False,
) -> Path:
    """Search, write results/<run-id>/tune/ and its report; return the results folder.

    server: score each candidate by the server scenario's rate (the highest Poisson arrival rate
    whose p99 is within the budget) instead of the closed loop's throughput.
    TuneError when no configuration meets the budget (the closest ones are named;
    the files are written all the same).
    """
    if p99_ms <= 0:
        raise TuneError(f"--p99-ms is {p99_ms:g}: give a latency budget in milliseconds, > 0")
    check_request(model, settings, state, batch_sizes)
    profile = "quick" if quick else "full"
    perf_profile = dict(settings["bench"][profile])
    perf_profile["concurrency_range"] = concurrency or perf_profile["concurrency_range"]
    values_tried, left_out = searched_values(profile, batch_sizes, perf_profile["concurrency_range"], server)
    if left_out:
        say(left_out)
    host_gpus = int(state.deploy["hosts"][state.hosts[0].name].get("gpu_count") or 0)
    gpu_count = min(host_gpus, max_gpus) if max_gpus else host_gpus
    # The longest this search can be must fit in a lease, checked before anything is written: the
    # deployed one, every value of every setting, 2 preferred-size choices, the GPU counts, 2 again.
    longest = 1 + sum(len(v) for v in values_tried.values()) + 2 + gpu_count + 2
    lease_for(settings, state, longest, perf_profile, profile, server)
    job = Tune(settings, state, model, perf_profile, p99_ms if server else 0)
    say(f"tuning {model} on {job.host} for p99 <= {p99_ms:g} ms ({profile} search, {job.load_words()})")
    started = time.monotonic()
    deployed_text = job.fetch_deployed()
    values = deployed_values(deployed_text, host_gpus, settings, bool(state.deploy.get("smoke_weights")))
    baseline = tunable_settings(model, values)
    if host_gpus == 0:
        baseline.pop("gpus", None)  # CPU instances: no GPU count to choose
    measure = _measuring(job, values, p99_ms, say)
    try:
        candidates, settled = search(measure, baseline, p99_ms, values_tried, gpu_count)
        again = []
        if settled.score(p99_ms) > 0 and settled is not candidates[0]:
            # Side by side once more: the winner's lead is not one noisy window.
            say("measuring the best and the deployed configuration again, side by side")
            again = [measure(settled.settings), measure(baseline)]
    finally:
        # Also after Ctrl-C: the deployment serves what it served before.
        with interrupts.refused("putting the deployed configuration back first"):
            say("putting the deployed configuration back")
            job.restore(deployed_text)
    winner = settled if settled.score(p99_ms) > 0 else None
    summary = _summary(job, state, profile, p99_ms, candidates, winner, again, baseline, values_tried, gpu_count)
    summary.update(wall_s=round(time.monotonic() - started, 1), batch_sizes_left_out=left_out or None)
    if again and not confirmed(again, p99_ms):
        summary.update(_deployed_stays(summary, again, p99_ms))
    write_results(job, candidates + again, summary)
    if winner is None:
        raise _nothing_within(job, candidates, p99_ms)
    say(
        f"best: {winner.describe(p99_ms)} ({len(candidates)} of {summary['configurations_in_grid']} configurations "
        f"measured, {summary['wall_s'] / 60:.1f} min)"
    )
    say(summary.get("verdict") or f"deploy the best: fab deploy --models-from {job.folder / 'best.json'}")
    return job.results


def _nothing_within(job: Tune, candidates: list[Candidate], p99_ms: float) -> TuneError:
    """The error of a search that met the budget nowhere: the closest candidates, and what to change."""
    closest = "\n".join(f"  {c.describe(p99_ms)}" for c in _misses(candidates, None)[:CLOSEST_MISSES])
    return TuneError(
        f"no configuration of {job.model} kept p99 within {p99_ms:g} ms ({job.load_words()}; "
        f"{len(candidates)} measured). The closest:\n{closest}\n"
        f"Results: {job.folder}. Raise --p99-ms, or lower the concurrency (--concurrency 1:2:1)."
    )


def searched_values(profile: str, batch_sizes: list[int] | None, concurrency_range: str, server: bool):
    """(the values the search tries, a line saying which max_batch_size values were left out and why, or "").

    Under closed-loop concurrency N no more than N requests are ever in flight, so a max_batch_size
    above the highest concurrency measured can never fill, and cannot differ from that one: such
    values are left out (the Poisson arrivals of the server scenario have no such ceiling)."""
    values = {**VALUES[profile], **({"max_batch_size": sorted(set(batch_sizes))} if batch_sizes else {})}
    if server:
        return values, ""
    ceiling = max(concurrency_levels(concurrency_range))
    kept = [size for size in values["max_batch_size"] if size <= ceiling] or [min(values["max_batch_size"])]
    dropped = [size for size in values["max_batch_size"] if size not in kept]
    if not dropped:
        return values, ""
    return {**values, "max_batch_size": kept}, (
        f"max_batch_size {', '.join(map(str, dropped))} left out: at concurrency {concurrency_range} no more than "
        f"{ceiling} requests are ever in flight, so a larger batch cannot fill (the rule: batch sizes up to the "
        f"highest concurrency; raise it with --concurrency, e.g. 2:{max(dropped)}:{max(dropped) // 2 or 1})"
    )


def confirmed(again: list[Candidate], budget_ms: float) -> bool:
    """Measured again side by side (the best, then the deployed), the best still beats the deployed
    configuration by more than the noise (MIN_GAIN): only then is it recommended."""
    best, deployed = again
    return best.score(budget_ms) > deployed.score(budget_ms) * (1 + MIN_GAIN)


def _deployed_stays(summary: dict, again: list[Candidate], budget_ms: float) -> dict:
    """best.json's answer when the re-measurement contradicts the search: the deployed settings, and why."""
    best, deployed = again
    def measured(candidate: Candidate) -> str:
        row = candidate.reported_row(budget_ms)
        return worth_words(row) if row else f"not measured: {candidate.error}"

    verdict = (
        f"not recommended: measured again side by side, the best ({measured(best)}) did not "
        f"beat the deployed configuration ({measured(deployed)}) by more than "
        f"{MIN_GAIN:.0%}, the noise: the deployed settings stay (best.json holds them)"
    )
    return {
        "recommended": False,
        "verdict": verdict,
        "rejected": {"settings": summary["settings"], "measured": summary["measured"]},
        "settings": summary["deployed"]["settings"],
        "measured": figures(deployed.reported_row(budget_ms)),
    }


def _measuring(
    job: Tune, values: RenderValues, p99_ms: float, say: Callable[[str], None]
) -> Callable[[dict], Candidate]:
    """The search's `measure`: render a candidate's settings, load and measure it, say what it gave."""
    numbers = itertools.count(1)

    def measure(candidate_settings: dict) -> Candidate:
        candidate = Candidate(next(numbers), candidate_settings)
        config_text = render_config(job.model, replace(values, tuned={**values.tuned, job.model: candidate_settings}))
        try:
            candidate.rows = job.measure(candidate.number, config_text)
        except PlaybookInterrupted:
            raise
        except PlaybookError as error:  # a config Triton refuses, a measurement that failed
            candidate.error = failure_reason(error)
        except (TuneError, ValueError) as error:  # no stable measurement
            candidate.error = str(error).splitlines()[0]
        say(f"  candidate {candidate.number}: {candidate.describe(p99_ms)}")
        return candidate

    return measure


def _misses(candidates: list[Candidate], winner: Candidate | None) -> list[Candidate]:
    """The measured candidates other than the winner, closest to the budget first."""
    return sorted((c for c in candidates if c is not winner and c.rows), key=lambda c: c.closest_row()["p99_us"])


def _summary(job, state, profile, p99_ms, candidates, winner, again, baseline, values_tried, gpu_count) -> dict:
    """best.json: the winner (or none), the deployed configuration, the closest misses, how much was measured."""
    return {
        "model": job.model,
        "host": job.host,
        "target": state.target,
        "runtime": state.runtime,
        "budget_p99_ms": p99_ms,
        "search": profile,
        "concurrency_range": job.perf_profile["concurrency_range"],
        "scenario": "server" if job.server_p99_ms else "closed_loop",
        "load": job.load_words(),
        "settings": winner.settings if winner else None,
        "measured": figures(winner.best_row(p99_ms)) if winner else None,
        "deployed": {"settings": baseline, **(figures(candidates[0].best_row(p99_ms)) or {})},
        "measured_again": {
            "best": figures(again[0].reported_row(p99_ms)),
            "deployed": figures(again[1].reported_row(p99_ms)),
        }
        if again
        else None,
        "closest_misses": [
            {"settings": c.settings, **figures(c.closest_row())} for c in _misses(candidates, winner)[:CLOSEST_MISSES]
        ],
        "configurations_measured": len(candidates),
        "configurations_in_grid": grid_size(baseline, values_tried, gpu_count),
        "git": git_commit(),
    }


def figures(row: dict | None) -> dict | None:
    """One perf_analyzer row as the results give it: milliseconds, GPU utilisation and memory where measured."""
    if not row:
        return None
    figures = {
        **({"concurrency": row["concurrency"]} if "concurrency" in row else {}),
        **({"request_rate": round(row["request_rate"], 3)} if "request_rate" in row else {}),
        "throughput": round(row["throughput"], 2),
        "p50_ms": round(row["p50_us"] / 1000, 2),
        "p95_ms": round(row["p95_us"] / 1000, 2),
        "p99_ms": round(row["p99_us"] / 1000, 2),
    }
    gpus = row.get("gpus") or {}
    if gpus:
        figures["gpu_utilization"] = round(sum(g.get("utilization", 0) for g in gpus.values()) / len(gpus), 3)
        figures["gpu_memory_mb"] = round(max(g.get("memory_used_bytes", 0) for g in gpus.values()) / 2**20)
    return figures


# --------------------------------------------------------------------------- results


def write_results(job: Tune, candidates: list[Candidate], summary: dict) -> None:
    """candidates.csv, best.json, pareto.png and report.md (its Tune section)."""
    budget = summary["budget_p99_ms"]
    with open(job.folder / "candidates.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, CSV_FIELDS)
        writer.writeheader()
        for candidate in candidates:
            writer.writerow(
                {
                    "candidate": candidate.number,
                    **{
                        name: json.dumps(value) if isinstance(value, list) else value
                        for name, value in candidate.settings.items()
                    },
                    "meets_budget": candidate.best_row(budget) is not None,
                    **(figures(candidate.reported_row(budget)) or {}),
                }
            )
    (job.folder / "best.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot = _pareto_plot(
        job.folder / "pareto.png",
        candidates,
        budget,
        f"{summary['model']} on {summary['host']}, run {job.results.name}",
    )
    (job.results / "report.md").write_text(report_section(summary, candidates, plot))


def _worth_ms(figures: dict) -> str:
    """worth_words() of a row as the results give it (figures())."""
    if "request_rate" in figures:
        return f"{figures['request_rate']:g} requests/s sustained"
    return f"{figures['throughput']:.1f} infer/s"


def _measured_again(summary: dict) -> list[str]:
    again = summary["measured_again"]
    if not again:
        return []
    best, deployed = again["best"], again["deployed"]

    def words(figures: dict | None) -> str:  # None: that re-measurement gave no row
        return f"{_worth_ms(figures)} (p99 {figures['p99_ms']:.1f} ms at {load(figures)})" if figures else "not measured"

    ratio = f", {worth(best) / worth(deployed):.2f}x" if best and deployed and worth(deployed) else ""
    return [f"Measured again, side by side: the best {words(best)}, the deployed {words(deployed)}{ratio}.", ""]


def pareto_figure(candidates: list[Candidate], budget_ms: float, what: str):
    """pareto.png's figure: every candidate at every concurrency (numbered as candidates.csv numbers them),
    the Pareto front, the p99 budget; its title names the model, host and run (`what`)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    points = [(row["p99_us"] / 1000, worth(row), c) for c in candidates for row in c.rows]
    if not points:
        return None
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    axes.scatter(
        [p for p, _, _ in points], [t for _, t, _ in points], s=18, color="0.6", label="candidate x load"
    )
    for p99, throughput, candidate in points:
        axes.annotate(str(candidate.number), (p99, throughput), textcoords="offset points", xytext=(3, 3), fontsize=7)
    frontier, best_so_far = [], -1.0
    for p99, throughput, _ in sorted(points, key=lambda point: (point[0], -point[1])):
        if throughput > best_so_far:
            frontier.append((p99, throughput))
            best_so_far = throughput
    axes.plot(*zip(*frontier), color="C0", marker="o", label="Pareto front")
    axes.axvline(budget_ms, color="C3", linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    server = any("request_rate" in row for c in candidates for row in c.rows)
    ylabel = "sustained rate (requests/s, Poisson arrivals)" if server else "throughput (infer/s)"
    axes.set(xlabel="p99 latency (ms)", ylabel=ylabel, title=f"fab tune: {what}")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the points, not over them
    figure.tight_layout()
    return figure


def _pareto_plot(path: Path, candidates: list[Candidate], budget_ms: float, what: str = "") -> Path | None:
    figure = pareto_figure(candidates, budget_ms, what)
    if figure is None:
        return None
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def report_section(summary: dict, candidates: list[Candidate], plot: Path | None) -> str:
    budget = summary["budget_p99_ms"]
    measured = summary["measured"]
    lines = [
        f"# fab tune: {summary['model']} on {summary['host']} ({summary['target']}, {summary['runtime']} runtime)",
        "",
        "## Tune",
        "",
        f"Budget: p99 <= {budget:g} ms ({summary.get('load') or 'concurrency ' + summary['concurrency_range']}); "
        f"{summary['search']} search, {summary['configurations_measured']} of {summary['configurations_in_grid']} "
        f"configurations of the full grid measured in {summary['wall_s'] / 60:.1f} min.",
        "",
    ]
    if summary.get("batch_sizes_left_out"):
        lines += [summary["batch_sizes_left_out"] + ".", ""]
    if measured:
        deployed = summary["deployed"]
        if summary.get("rejected"):
            measured = summary["rejected"]["measured"]
        lines += [
            f"Best: {format_settings((summary.get('rejected') or summary)['settings'])}: **{_worth_ms(measured)}** at {load(measured)}, "
            f"p99 {measured['p99_ms']:.1f} ms"
            + (
                f" (the deployed configuration: {_worth_ms(deployed)} within the budget, "
                f"{worth(measured) / worth(deployed):.2f}x)."
                if deployed.get("throughput")
                else " (the deployed configuration met the budget at no load measured)."
            ),
            "",
            *_measured_again(summary),
            f"**{summary['verdict'][0].upper()}{summary['verdict'][1:]}.**"
            if summary.get("verdict")
            else "Deploy it: `fab deploy --models-from tune/best.json` (path relative to this folder).",
        ]
    else:
        lines.append("**No configuration met the budget.** The closest are listed in tune/best.json.")
    lines += [
        "",
        "| # | settings | within budget | load | infer/s | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for candidate in candidates:
        row = figures(candidate.reported_row(budget))
        if row:
            lines.append(
                f"| {candidate.number} | {format_settings(candidate.settings)} | {'yes' if candidate.best_row(budget) else 'no'} | "
                f"{load(row)} | {row['throughput']:.1f} | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} | {row['p99_ms']:.1f} |"
            )
        else:
            lines.append(
                f"| {candidate.number} | {format_settings(candidate.settings)} | not measured: {candidate.error} | | | | | |"
            )
    if plot:
        lines += ["", f"![throughput against p99](tune/{plot.name})"]
    return "\n".join(lines) + "\n"
