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

from provision import interrupts, perf
from provision import state as state_module
from provision.ansible import PlaybookError, PlaybookInterrupted, run_playbook
from provision.errors import OperationError
from provision.measure import Measurement, RunFolder, failure_reason, git_commit, lease_for, playbook_run, run_folder
from provision.model_repo import RenderValues, model_names, render_config, tunable_settings
from provision.perf import concurrency_levels, fresh_csv, host_load, unstable_reason

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
    "gpu_memory_mb", "median_of", "spread_low", "spread_high", "host_load_max", "cores",
]  # fmt: skip


class TuneError(OperationError):
    """The tune cannot start or found nothing within the budget; the message says what to do."""


@dataclass
class Candidate:
    """One configuration of the model and what perf_analyzer measured of it.

    It is measured lab.tune.repeats times, back to back. Its figure is the median of the
    measurements' worths within the budget (the lower middle one for an even count), and `rows`
    are that median measurement's own rows: every figure reported for a candidate is one that
    perf_analyzer measured. `worths` keeps every measurement's worth: their range is the spread.
    """

    number: int
    settings: dict
    rows: list[dict] = field(default_factory=list)  # the median measurement's, one per concurrency (or rate)
    error: str = ""  # why it was not measured (Triton refused the config, no stable measurement)
    worths: list[float] = field(default_factory=list)  # each stable measurement's worth within the budget
    missed: int = 0  # measurements with no stable window (left out of the median)
    loads: list[dict] = field(default_factory=list)  # the host's load as each measurement ended

    def keep_median(self, measurements: list[list[dict]], budget_ms: float) -> None:
        """Keep the median of the measurements (each one's rows) by their worth within the budget."""
        worths = [score_of(rows, budget_ms) for rows in measurements]
        order = sorted(range(len(measurements)), key=lambda index: worths[index])
        self.rows = measurements[order[(len(order) - 1) // 2]] if measurements else []
        self.worths = worths

    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest worth of its measurements, to 0.01 as every output gives them (one rounding,
        so the report and best.json cannot disagree in the last digit); None: measured fewer than twice."""
        return (round(min(self.worths), 2), round(max(self.worths), 2)) if len(self.worths) > 1 else None

    def spread_words(self) -> str:
        """spread_words() of its measurements, and those that had no stable window."""
        words = spread_words(len(self.worths), self.spread())
        if self.missed:
            words += f"{'; ' if words else ''}{self.missed} more with no stable measurement"
        return words

    def within(self, budget_ms: float) -> list[dict]:
        """Its rows that count within the budget (counts(): a Poisson rate also sent and answered)."""
        return [row for row in self.rows if counts(row, budget_ms)]

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
        spread = f" ({words})" if (words := self.spread_words()) else ""
        figures = (
            f"{worth_words(row)}{spread}, p99 {row['p99_us'] / 1000:.1f} ms at {load(row)}"
            if row
            else f"not measured: {self.error}"
        )
        return f"{format_settings(self.settings)}: {figures}"

    def figures(self, row: dict | None) -> dict | None:
        """figures(row), with how many measurements the median was of and their spread (best.json)."""
        found = figures(row)
        if found is None:
            return None
        spread = self.spread()
        spread = [round(value, 2) for value in spread] if spread else None
        return {**found, "median_of": len(self.worths), **({"spread": spread} if spread else {})}


    def highest_load(self) -> dict | None:
        """The highest host load any of its measurements ended under (None: not recorded)."""
        return max(self.loads, key=lambda load: load["load_average"], default=None)


def spread_words(median_of: int, spread) -> str:
    """ "median of 3: 48.1 to 53.3"; "" without a spread (one measurement)."""
    return f"median of {median_of}: {spread[0]:.1f} to {spread[1]:.1f}" if spread else ""


def score_of(rows: list[dict], budget_ms: float) -> float:
    """What one measurement is worth: its best row within the budget (worth()), 0 where none is within.
    A Poisson rate counts only where it was sent on schedule and answered (perf.shortfall), as in fab bench."""
    return max((worth(row) for row in rows if counts(row, budget_ms)), default=0.0)


def counts(row: dict, budget_ms: float) -> bool:
    if "request_rate" in row:
        return perf.shortfall(row, budget_ms) is None
    return row["p99_us"] <= budget_ms * 1000


def worth(row: dict) -> float:
    """What a configuration is worth at one row: its throughput, to 0.1 infer/s as the report gives it
    (differences below that are no difference: two configurations that answered perf_analyzer's same
    Poisson schedule alike are a tie). Of the server scenario's rows, that is the Poisson rate sent and
    answered (perf_analyzer's schedule may carry less than the rate asked: perf.py)."""
    return round(row["throughput"], 1)


def worth_words(row: dict) -> str:
    if "request_rate" in row:
        return f"{row['throughput']:.1f} requests/s sent and answered (asked: {row['request_rate']:g}/s)"
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
    budget_ms: float  # the p99 budget
    server: bool = False  # the server scenario: each candidate's highest Poisson rate within the budget
    repeats: int = 1  # measurements of each candidate, back to back (lab.tune.repeats)
    deployed_text: str = ""  # the deployed config.pbtxt, fetched first, put back last

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

    @property
    def server_p99_ms(self) -> float:
        """perf_analyzer's latency bound: the budget under the server scenario, 0 under the closed loop."""
        return self.budget_ms if self.server else 0

    def repeats_words(self) -> str:
        if self.repeats == 1:
            return "each candidate measured once"
        return f"each candidate measured {self.repeats} times, its median kept"

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
        self.deployed_text = (self.folder / "deployed.pbtxt").read_text()
        return self.deployed_text

    def measure(self, number: int, config_text: str) -> list[tuple[list[dict], dict | None]]:
        """Load one candidate and measure it `repeats` times back to back (warmed up before the first):
        each stable measurement's perf_analyzer rows and the host's load as it ended, in order; the
        files are <model>-<k>.csv/.log. TuneError: no measurement was stable."""
        results = self.folder / "measurements" / f"{number:02d}"
        measurement = f"{self.run.id}/{self.model}/{number:02d}"
        runs = [replace(self.perf_run, csv_path=Path(f"{self.model}-{k}.csv")) for k in range(1, self.repeats + 1)]
        self.playbook(
            results,
            lab_tune_config=config_text,
            lab_bench_runs={
                self.host: [playbook_run(run, f"{measurement}/{k}", warm_up=k == 1) for k, run in enumerate(runs, 1)]
            },
            lab_bench_prepare=False,
            lab_bench_finish=False,
        )
        host = RunFolder(results).host(self.host)
        measured, reason = [], None
        for k, run in enumerate(runs, 1):
            log = host / f"{run.csv_path.stem}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            csv_file = fresh_csv(host / run.csv_path.name, log, f"{measurement}/{k}")
            if csv_file:
                measured.append((perf.with_rate_facts(perf.parse_csv(csv_file), text), host_load(text)))
            else:
                reason = unstable_reason(text) or reason
        if not measured:
            first = (
                f"any rate of {self.perf_profile['request_rate_range']}"
                if self.server_p99_ms
                else f"concurrency {concurrency_levels(self.perf_profile['concurrency_range'])[0]}"
            )
            raise TuneError(
                f"no stable measurement at {first}"
                + (f' (perf_analyzer: "{reason}")' if reason else f" (perf_analyzer's logs: {host})")
            )
        return measured

    def restore(self) -> None:
        """Put the deployed config back, load it, end the bench on the host (its folder removed)."""
        self.playbook(
            self.folder / "measurements" / "restored",
            lab_tune_config=self.deployed_text,
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
    repeats: int = 0,
) -> Path:
    """Search, write results/<run-id>/tune/ and its report; return the results folder.

    server: score each candidate by the server scenario's rate (the highest Poisson arrival rate
    whose p99 is within the budget) instead of the closed loop's throughput.
    repeats: measurements of each candidate (0: lab.tune.repeats); its figure is their median.
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
    repeats = measurements_per_candidate(settings, repeats)
    lease_for(settings, state, longest * repeats, perf_profile, profile, server)
    job = Tune(settings, state, model, perf_profile, p99_ms, server, repeats)
    say(
        f"tuning {model} on {job.host} for p99 <= {p99_ms:g} ms ({profile} search, {job.load_words()}; "
        f"{job.repeats_words()})"
    )
    started = time.monotonic()
    deployed_text = job.fetch_deployed()
    values = deployed_values(deployed_text, host_gpus, settings, bool(state.deploy.get("smoke_weights")))
    baseline = tunable_settings(model, values)
    if host_gpus == 0:
        baseline.pop("gpus", None)  # CPU instances: no GPU count to choose
    measuring, measured = _measuring(job, values, p99_ms, say), []

    def measure(candidate_settings: dict) -> Candidate:
        measured.append(candidate := measuring(candidate_settings))
        return candidate

    try:
        candidates, settled, again = _search_then_measure_again(job, measure, baseline, values_tried, gpu_count, say)
    except (KeyboardInterrupt, PlaybookInterrupted):  # Ctrl-C, SIGTERM: what was measured is kept
        write_interrupted(job, measured, "interrupted")
        raise
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


def _search_then_measure_again(
    job: Tune, measure: Callable[[dict], Candidate], baseline: dict, values: dict, gpu_count: int, say
) -> tuple[list[Candidate], Candidate, list[Candidate]]:
    """search(), then the candidate it settled on and the deployed one measured again, side by side
    (none when it settled on the deployed one, or on nothing within the budget); the deployed
    configuration is put back at the end, whatever happened."""
    budget_ms = job.budget_ms
    try:
        candidates, settled = search(measure, baseline, budget_ms, values, gpu_count)
        again = []
        if settled.score(budget_ms) > 0 and settled is not candidates[0]:
            # Side by side once more: the winner's lead is not one noisy window.
            say("measuring the best and the deployed configuration again, side by side")
            again = [measure(settled.settings), measure(baseline)]
    finally:
        # Also after Ctrl-C: the deployment serves what it served before.
        with interrupts.refused("putting the deployed configuration back first"):
            say("putting the deployed configuration back")
            job.restore()
    return candidates, settled, again


def _nothing_within(job: Tune, candidates: list[Candidate], p99_ms: float) -> TuneError:
    """The error of a search that met the budget nowhere: the closest candidates, and what to change."""
    closest = "\n".join(f"  {c.describe(p99_ms)}" for c in _misses(candidates, None)[:CLOSEST_MISSES])
    return TuneError(
        f"no configuration of {job.model} kept p99 within {p99_ms:g} ms ({job.load_words()}; "
        f"{len(candidates)} measured). The closest:\n{closest}\n"
        f"Results: {job.folder}. Raise --p99-ms, or lower the concurrency (--concurrency 1:2:1)."
    )


def measurements_per_candidate(settings: dict, repeats: int) -> int:
    """--repeats, else lab.tune.repeats: how many times each candidate is measured (TuneError below 1)."""
    count = int(repeats or settings.get("tune", {}).get("repeats", 3))
    if count < 1:
        raise TuneError(f"lab.tune.repeats is {count}: each candidate is measured at least once (3: docs/tune.md)")
    return count


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
    configuration beyond the noise: its median by more than MIN_GAIN, and every one of its measurements
    above every one of the deployed's (with 3 each, two configurations that are the same would do
    that 1 time in 20). Only then is it recommended."""
    best, deployed = again
    if best.score(budget_ms) <= deployed.score(budget_ms) * (1 + MIN_GAIN):
        return False
    return min(best.worths or [best.score(budget_ms)]) > max(deployed.worths or [deployed.score(budget_ms)])


def _deployed_stays(summary: dict, again: list[Candidate], budget_ms: float) -> dict:
    """best.json's answer when the re-measurement contradicts the search: the deployed settings, and why."""
    best, deployed = again
    def measured(candidate: Candidate) -> str:
        row = candidate.reported_row(budget_ms)
        spread = f"; {words}" if (words := candidate.spread_words()) else ""
        return f"{worth_words(row)}{spread}" if row else f"not measured: {candidate.error}"

    noise = f"by more than {MIN_GAIN:.0%}" + (
        ", every measurement of it above every one of the deployed's" if len(best.worths) > 1 else ""
    )
    verdict = (
        f"not recommended: measured again side by side, the best ({measured(best)}) did not "
        f"beat the deployed configuration ({measured(deployed)}) beyond the noise ({noise}): "
        "the deployed settings stay (best.json holds them)"
    )
    return {
        "recommended": False,
        "verdict": verdict,
        "rejected": {"settings": summary["settings"], "measured": summary["measured"]},
        "settings": summary["deployed"]["settings"],
        "measured": deployed.figures(deployed.reported_row(budget_ms)),
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
            measured = job.measure(candidate.number, config_text)
            candidate.keep_median([rows for rows, _ in measured], p99_ms)
            candidate.loads = [host_load for _, host_load in measured if host_load]
            candidate.missed = job.repeats - len(measured)
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
        "measured": winner.figures(winner.best_row(p99_ms)) if winner else None,
        "deployed": {"settings": baseline, **(candidates[0].figures(candidates[0].best_row(p99_ms)) or {})},
        "measured_again": {
            "best": again[0].figures(again[0].reported_row(p99_ms)),
            "deployed": again[1].figures(again[1].reported_row(p99_ms)),
        }
        if again
        else None,
        "closest_misses": [
            {"settings": c.settings, **figures(c.closest_row())} for c in _misses(candidates, winner)[:CLOSEST_MISSES]
        ],
        "configurations_measured": len(candidates),
        "measurements_per_candidate": job.repeats,
        "busy_measurements": _busy(candidates + again),
        "configurations_in_grid": grid_size(baseline, values_tried, gpu_count),
        "git": git_commit(),
        "smoke_weights": bool(state.deploy.get("smoke_weights")),
    }


def _busy(candidates: list[Candidate]) -> list[dict]:
    """The candidates with a measurement that ended on a busy host (run_folder.busy: a load average above
    the cores): each one's number, how many of its measurements, the highest load."""
    busy = run_folder().busy
    found = []
    for candidate in candidates:
        over = [load for load in candidate.loads if busy(load)]
        if over:
            found.append({"candidate": candidate.number, "measurements": len(over), "load": candidate.highest_load()})
    return found


def _csv_row(candidate: Candidate, budget_ms: float) -> dict:
    """A candidate's line of candidates.csv: its settings, its median measurement's figures, their spread, its load."""
    spread = candidate.spread()
    highest = candidate.highest_load()
    return {
        "candidate": candidate.number,
        **{name: json.dumps(value) if isinstance(value, list) else value for name, value in candidate.settings.items()},
        "meets_budget": candidate.best_row(budget_ms) is not None,
        **(figures(candidate.reported_row(budget_ms)) or {}),
        "median_of": len(candidate.worths) or "",
        "spread_low": round(spread[0], 2) if spread else "",
        "spread_high": round(spread[1], 2) if spread else "",
        "host_load_max": highest["load_average"] if highest else "",
        "cores": highest["cores"] if highest else "",
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
            writer.writerow(_csv_row(candidate, budget))
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
        return f"{figures['throughput']:.1f} requests/s sent and answered"
    return f"{figures['throughput']:.1f} infer/s"


def _spread_of(figures: dict) -> str:
    """spread_words() of a candidate's figures in best.json."""
    return spread_words(figures.get("median_of", 1), figures.get("spread"))


def _measured_again(summary: dict) -> list[str]:
    again = summary["measured_again"]
    if not again:
        return []
    best, deployed = again["best"], again["deployed"]

    def words(figures: dict | None) -> str:  # None: that re-measurement gave no row
        if not figures:
            return "not measured"
        spread = _spread_of(figures)
        return f"{_worth_ms(figures)} ({spread + '; ' if spread else ''}p99 {figures['p99_ms']:.1f} ms at {load(figures)})"

    ratio = f", {worth(best) / worth(deployed):.2f}x" if best and deployed and worth(deployed) else ""
    return [f"Measured again, side by side: the best {words(best)}, the deployed {words(deployed)}{ratio}.", ""]


def _busy_lines(summary: dict) -> list[str]:
    """The warning over a tune some of whose measurements ended on a busy host."""
    busy = summary.get("busy_measurements") or []
    if not busy:
        return []
    words = run_folder().load_words
    which = "; ".join(f"candidate {b['candidate']} ({b['measurements']} of its, up to {words(b['load'])})" for b in busy)
    return [
        f"> **BUSY HOST**: measured under a load average above the host's cores: {which}. Their figures may be "
        "low; the median and the side-by-side check guard against one such measurement, not against a host busy "
        "throughout.",
        "",
    ]


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
    frontier, best_so_far = [], -1.0
    for p99, throughput, _ in sorted(points, key=lambda point: (point[0], -point[1])):
        if throughput > best_so_far:
            frontier.append((p99, throughput))
            best_so_far = throughput
    axes.plot(*zip(*frontier), color="C0", marker="o", label="Pareto front")
    axes.axvline(budget_ms, color="C3", linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    server = any("request_rate" in row for c in candidates for row in c.rows)
    ylabel = "sustained rate (requests/s sent and answered, Poisson)" if server else "throughput (infer/s)"
    axes.set(xlabel="p99 latency (ms)", ylabel=ylabel, title=f"fab tune: {what}")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the points, not over them
    figure.tight_layout()
    _number_points(axes, figure, points)  # last: where the labels fall depends on the final layout
    return figure


def _number_points(axes, figure, points: list) -> None:
    """Each point's candidate number beside it; points at one place share a label ("2, 5"), and a label
    that would cover one drawn before moves up until it does not."""
    at: dict[tuple, list[int]] = {}
    for p99, throughput, candidate in points:
        numbers = at.setdefault((round(p99, 1), round(throughput, 1)), [])
        if candidate.number not in numbers:
            numbers.append(candidate.number)
    renderer = figure.canvas.get_renderer()
    placed = []
    for (p99, throughput), numbers in at.items():
        label = axes.annotate(", ".join(map(str, numbers)), (p99, throughput), textcoords="offset points",
                              xytext=(3, 3), fontsize=7)  # fmt: skip
        for step in range(1, 12):
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            label.set_position((3, 3 + 7 * step))
        placed.append(label.get_window_extent(renderer))


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
    lines = [f"# fab tune: {summary['model']} on {summary['host']} ({summary['target']}, {summary['runtime']} runtime)", ""]
    if summary.get("smoke_weights"):  # as the bench's report says it
        lines += [
            "> **SMOKE WEIGHTS**: the models ran with randomly initialised weights. Throughput and latency",
            "> are real; labels and captions are meaningless.",
            "",
        ]
    git = summary.get("git") or {}
    lines += [
        f"- target: {summary['target']}, host: {summary['host']}, {summary['runtime']} runtime",
        f"- profile: {summary['search']} ({summary.get('load') or 'concurrency ' + summary['concurrency_range']})",
        f"- git commit: {git.get('commit')}{' (with uncommitted changes)' if git.get('dirty') else ''}",
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
    repeats = summary.get("measurements_per_candidate", 1)
    if repeats > 1:
        lines += [
            f"Each candidate was measured {repeats} times back to back; its figures are those of its median "
            "measurement, the spread the lowest and highest of the measurements.",
            "",
        ]
    lines += _busy_lines(summary)
    if measured:
        deployed = summary["deployed"]
        if summary.get("rejected"):
            measured = summary["rejected"]["measured"]
        spread = f" ({_spread_of(measured)})" if _spread_of(measured) else ""
        lines += [
            f"Best: {format_settings((summary.get('rejected') or summary)['settings'])}: **{_worth_ms(measured)}**"
            f"{spread} at {load(measured)}, p99 {measured['p99_ms']:.1f} ms"
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
    lines += ["", *candidates_table(candidates, budget, (summary.get("deployed") or {}).get("settings"))]
    if plot:
        lines += ["", f"![throughput against p99](tune/{plot.name})"]
    return "\n".join(lines) + "\n"


def candidates_table(candidates: list[Candidate], budget: float, deployed_settings: dict | None) -> list[str]:
    """The report's table of every candidate measured, the deployed configuration marked."""
    lines = [
        "| # | settings | within budget | measured at | infer/s | spread | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for candidate in candidates:
        row = figures(candidate.reported_row(budget))
        named = format_settings(candidate.settings) + (" (deployed)" if candidate.settings == deployed_settings else "")
        if row:
            lines.append(
                f"| {candidate.number} | {named} | {'yes' if candidate.best_row(budget) else 'no'} | "
                f"{load(row)} | {row['throughput']:.1f} | {candidate.spread_words() or '-'} | {row['p50_ms']:.1f} | "
                f"{row['p95_ms']:.1f} | {row['p99_ms']:.1f} |"
            )
        else:
            lines.append(f"| {candidate.number} | {named} | not measured: {candidate.error} | | | | | | |")
    return lines


def write_interrupted(job: Tune, candidates: list[Candidate], why: str) -> None:
    """What an interrupted tune measured: candidates.csv, and report.md marked partial (no recommendation)."""
    job.folder.mkdir(parents=True, exist_ok=True)
    with open(job.folder / "candidates.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, CSV_FIELDS)
        writer.writeheader()
        for candidate in candidates:
            writer.writerow(_csv_row(candidate, job.budget_ms))
    line = (
        f"The tune stopped early ({why}) after {len(candidates)} candidate(s): no recommendation; "
        "the deployed configuration was put back."
    )
    lines = [f"# fab tune: {job.model} on {job.host} (stopped early)", "", f"> **PARTIAL**: {line}", "",
             f"Budget: p99 <= {job.budget_ms:g} ms ({job.load_words()}).", ""]  # fmt: skip
    lines += candidates_table(candidates, job.budget_ms, candidates[0].settings if candidates else None)
    (job.results / "report.md").write_text("\n".join(lines) + "\n")
    RunFolder(job.results).mark_partial(line)
