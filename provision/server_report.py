"""The server scenario's results (fab bench --scenario server): the highest Poisson rate within a p99 bound.

MLPerf Inference's Server scenario: requests arrive as a Poisson process
(they do not wait for each other's answers, so queueing shows), and a
configuration is worth the highest arrival rate whose p99 latency stays within
the bound. perf_analyzer searches it itself (--binary-search over
lab.bench.<profile>.request_rate_range, --latency-threshold the bound,
--percentile=99): it measures the range's two ends, then halves the interval
towards the bound until it is narrower than the range's step (a range of one
rate is measured once, without the search). Each rate is
measured as a concurrency is (the profile's windows and stability); a rate
with no stable measurement counts as over the bound, and perf_analyzer's CSV
holds only the rates it measured within the bound. The rates tried, in order,
are in its log, with how many requests it sent late at each.

perf_analyzer's search looks at p99 only. A rate counts as sustained here only
where it was also sent on schedule and answered (provision.perf.shortfall):
perf_analyzer's "not able to keep up" warning, or fewer than 90 % of the
requests it says it sent answered, rules it out, and the report says why. A
rate is quoted as sent and answered: perf_analyzer's own schedule may carry
less than the rate asked (provision/perf.py). Every rate tried is in the
table, with its verdict.

summary.json gets "server": {"p99_ms", "models": {model: {"sustained": the
row of the highest rate sent and answered among those sustained (None: none was), "rates_tried", "rates":
[{"request_rate", "sustained", "why"}] for every rate tried, "next_over": the
lowest rate tried above it (None: it is the top of the range)}}}; report.md a
section per model; server_rates.png p99 against the offered rate, with the bound.
"""

from __future__ import annotations

from pathlib import Path

from provision.config import client_script
from provision.perf import (
    ANSWERED_FRACTION,
    DELAYED_LIMIT_PERCENT,
    csv_rate,
    over_the_limit,
    rates_tried,
    schedule_shortfall,
    shortfall,
    sustained,
)


def summarize(
    host_folder: Path, models: dict[str, list[dict]], p99_ms: float, searched: str, benchmarked: list[str]
) -> dict:
    """summary.json's "server" part, from the first host's CSVs (parsed: `models`) and perf_analyzer's logs,
    for every model benchmarked (one whose first rate was already over the bound has no CSV)."""
    top = client_script("perf_run").rate_range(searched)[1]
    found = {}
    for model in benchmarked:
        rows = models.get(model, [])
        log = host_folder / f"{model}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        tried = rates_tried(text)
        best = sustained(rows, p99_ms)
        above = [rate for rate in tried if best is None or rate > best["request_rate"]]
        found[model] = {
            "sustained": best,
            "rates_tried": tried,
            "rates": verdicts(rows, tried, p99_ms, over_the_limit(text)),
            "next_over": min(above) if above else None,
            "top_of_range": best is not None and best["request_rate"] >= top,
        }
    return {"p99_ms": p99_ms, "request_rate_range": str(searched), "models": found}


def verdicts(rows: list[dict], tried: list[float], p99_ms: float, stopped_over: bool) -> list[dict]:
    """Every rate tried, lowest first: {"request_rate", "sustained", "why"} (why: "" where it was sustained).
    A rate with no row went over the bound (perf_analyzer stops a rate there and writes no row for it)
    or had no stable measurement."""
    measured = {csv_rate(row["request_rate"]): row for row in rows if "request_rate" in row}
    found = []
    for rate in sorted(set(tried) | set(measured)):
        row = measured.get(rate)
        if row is not None:
            why = shortfall(row, p99_ms) or ""
        elif stopped_over:
            why = f"over the bound: perf_analyzer stopped at its p99 over {p99_ms:g} ms, keeping no figures"
        else:
            why = "no stable measurement"
        found.append({"request_rate": rate, "sustained": not why, "why": why})
    return found


def rate_words(rate: float) -> str:
    """A rate as the report gives it: 0.46, 6.6, 24 (two significant figures below 10, one decimal above)."""
    return f"{rate:.2g}" if rate < 10 else f"{rate:.1f}"


def _ms(microseconds: float) -> str:
    return f"{microseconds / 1000:.1f}"


def section(model: str, rows: list[dict], server: dict, command: str, title: str) -> list[str]:
    """One model's section of report.md: the sustainable rate, every rate tried with its verdict, where
    the latency goes."""
    p99_ms, found = server["p99_ms"], server["models"][model]
    best = found["sustained"]
    lines = [f"## {title}", ""]
    rows = rows or []
    rates = found["rates"]
    if best:
        lines.append(
            f"Sustainable rate (Poisson arrivals, p99 <= {p99_ms:g} ms, sent on schedule and answered): "
            f"**{rate_words(best['throughput'])} requests/s sent and answered**, at perf_analyzer's rate "
            f"{best['request_rate']:g}/s: p50 {_ms(best['p50_us'])} ms, p99 {_ms(best['p99_us'])} ms"
            + (" (the top of the range searched: raise request_rate_range's end to look higher)." if found["top_of_range"] else ".")
        )
        if short := schedule_shortfall(best):
            lines.append(f"It is quoted as sent, not as asked: {short}.")
    elif any(row["p99_us"] <= p99_ms * 1000 for row in rows):
        lines.append(
            f"No rate tried was sustained: those within p99 {p99_ms:g} ms were not sent on schedule or not answered "
            "(the table says which and why)."
        )
    else:
        lowest = f" (perf_analyzer stopped at {found['rates_tried'][0]:g} requests/s)" if found["rates_tried"] else ""
        lines.append(
            f"No rate of {server['request_rate_range']} kept p99 within {p99_ms:g} ms, the lowest included{lowest}: "
            "raise --p99-ms, or lower request_rate_range's start."
        )
    if best and found["next_over"] is not None:
        why = next((rate["why"] for rate in rates if rate["request_rate"] == found["next_over"]), "")
        if why:  # (a rate above it that was sustained but answered less is in the table as "yes")
            lines.append(f"The next rate tried above it, {found['next_over']:g} requests/s, was not sustained: {why}.")
    measured = {row["request_rate"]: row for row in rows}
    if rates:
        lines += [
            "",
            "| rate asked (requests/s) | sent late | infer/s answered | answered / asked | p50 ms | p99 ms | sustained |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
    for rate in rates:
        row = measured.get(rate["request_rate"])
        verdict = "yes" if rate["sustained"] else f"no: {rate['why']}"
        if row is None:
            lines.append(f"| {rate['request_rate']:g} | | | | | | {verdict} |")
            continue
        lines.append(
            f"| {rate['request_rate']:g} | {row.get('delayed_percent', 0.0):g} % | {row['throughput']:.2f} | "
            f"{row['throughput'] / rate['request_rate']:.2f} | {_ms(row['p50_us'])} | {_ms(row['p99_us'])} | {verdict} |"
        )
    tried = ", ".join(f"{rate:g}" for rate in found["rates_tried"]) or "none logged"
    lines += ["", f"Rates tried, in perf_analyzer's order: {tried}. perf_analyzer's search follows p99 alone; a rate "
              f"counts here only where fewer than {DELAYED_LIMIT_PERCENT:g} % of its requests were sent late and at "
              f"least {ANSWERED_FRACTION * 100:.0f} % of those sent were answered."]
    shorts = [row for row in rows if schedule_shortfall(row)]
    if shorts:
        lines += ["", "Where answered / asked is under 0.9 with no request late, perf_analyzer sent fewer than it was "
                  "asked: its Poisson schedule is the same every run and starts slow, so a measurement of few "
                  "requests carries less than the rate (docs/pipeline.md). Those rates are worth what was sent."]
    split = client_script("latency_split").table([best] if best else [], "request_rate", "requests/s")
    if split:
        lines += ["", f"Where the average latency goes at {best['request_rate']:g} requests/s (ms):", "", *split]
    return [*lines, "", f"perf_analyzer: `{command}`", ""]


def rate_figure(models: dict[str, list[dict]], p99_ms: float, title: str, labels: dict[str, str]):
    """p99 latency against the offered rate (log axis: the search halves intervals), one line per model,
    the bound dashed; None where no model has a row."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    measured = {model: rows for model, rows in models.items() if rows}
    if not measured:
        return None
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    for model, rows in measured.items():
        axes.plot([r["request_rate"] for r in rows], [r["p99_us"] / 1000 for r in rows], marker="o", label=labels[model])
    axes.axhline(p99_ms, color="C3", linestyle="--", label=f"p99 bound {p99_ms:g} ms")
    axes.set_xscale("log", base=2)
    axes.set(xlabel="offered rate (requests/s, Poisson arrivals)", ylabel="p99 latency (ms)", title=title)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the lines, not over them
    figure.tight_layout()
    return figure
