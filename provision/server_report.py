"""The server scenario's results (fab bench --scenario server): the highest Poisson rate within a p99 bound.

MLPerf Inference's Server scenario: requests arrive as a Poisson process
(they do not wait for each other's answers, so queueing shows), and a
configuration is worth the highest arrival rate whose p99 latency stays within
the bound. perf_analyzer searches it itself (--binary-search over
lab.bench.<profile>.request_rate_range, --latency-threshold the bound,
--percentile=99): it measures the range's two ends, then halves the interval
towards the bound until it is narrower than the range's step. Each rate is
measured as a concurrency is (the profile's windows and stability); a rate
with no stable measurement counts as over the bound, and perf_analyzer's CSV
holds only the rates it measured stably. The rates tried, in order, are in
its log.

summary.json gets "server": {"p99_ms", "models": {model: {"sustained": the
row of the highest rate within the bound (None: none was), "rates_tried",
"next_over": the lowest rate tried above it (None: it is the top of the
range)}}}; report.md a section per model; server_rates.png p99 against the
offered rate, with the bound.
"""

from __future__ import annotations

from pathlib import Path

from provision.config import client_script
from provision.perf import rate_range, rates_tried, sustained


def summarize(
    host_folder: Path, models: dict[str, list[dict]], p99_ms: float, searched: str, benchmarked: list[str]
) -> dict:
    """summary.json's "server" part, from the first host's CSVs (parsed: `models`) and perf_analyzer's logs,
    for every model benchmarked (one whose first rate was already over the bound has no CSV)."""
    top = rate_range(searched)[1]
    found = {}
    for model in benchmarked:
        rows = models.get(model, [])
        log = host_folder / f"{model}.log"
        tried = rates_tried(log.read_text(errors="replace")) if log.exists() else []
        best = sustained(rows, p99_ms)
        above = [rate for rate in tried if best is None or rate > best["request_rate"]]
        found[model] = {
            "sustained": best,
            "rates_tried": tried,
            "next_over": min(above) if above else None,
            "top_of_range": best is not None and best["request_rate"] >= top,
        }
    return {"p99_ms": p99_ms, "request_rate_range": str(searched), "models": found}


def _ms(microseconds: float) -> str:
    return f"{microseconds / 1000:.1f}"


def section(model: str, rows: list[dict], server: dict, command: str, title: str) -> list[str]:
    """One model's section of report.md: the sustainable rate, the rates measured, where its latency goes."""
    p99_ms, found = server["p99_ms"], server["models"][model]
    best = found["sustained"]
    lines = [f"## {title}", ""]
    rows = rows or []
    if best:
        lines.append(
            f"Sustainable rate (Poisson arrivals, p99 <= {p99_ms:g} ms): **{best['request_rate']:g} requests/s**: "
            f"{best['throughput']:.1f} infer/s answered, p50 {_ms(best['p50_us'])} ms, p99 {_ms(best['p99_us'])} ms"
            + (" (the top of the range searched: raise request_rate_range's end to look higher)." if found["top_of_range"] else ".")
        )
    else:
        lowest = f" (perf_analyzer stopped at {found['rates_tried'][0]:g} requests/s)" if found["rates_tried"] else ""
        lines.append(
            f"No rate of {server['request_rate_range']} kept p99 within {p99_ms:g} ms, the lowest included{lowest}: "
            "raise --p99-ms, or lower request_rate_range's start."
        )
    if best and found["next_over"] is not None:
        lines.append(f"The next rate tried above it, {found['next_over']:g} requests/s, went over the bound (or had no stable measurement).")
    if rows:
        lines += [
            "",
            "| offered rate (requests/s) | infer/s | p50 ms | p99 ms | within the bound |",
            "|---:|---:|---:|---:|---|",
        ]
    for row in rows:
        within = "yes" if row["p99_us"] <= p99_ms * 1000 else "no"
        lines.append(
            f"| {row['request_rate']:g} | {row['throughput']:.1f} | {_ms(row['p50_us'])} | {_ms(row['p99_us'])} | {within} |"
        )
    tried = ", ".join(f"{rate:g}" for rate in found["rates_tried"]) or "none logged"
    lines += ["", f"Rates tried, in perf_analyzer's order: {tried} (a rate missing from the table had no stable measurement)."]
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
