"""Where a request's average latency goes, as `fab bench` records it (summary.json rows' "split_us",
microseconds, perf_analyzer's own split of its average): the parts in words, and the table that the
report, the server scenario's report and profiling.ipynb show. Standard library only.
"""

from __future__ import annotations

# The parts in the order a request meets them, in the report's words (provision/perf.py reads them
# from perf_analyzer's CSV: "Network+Server Send/Recv" is what the server adds beyond its own queue
# and compute, the wire and Triton's HTTP handling).
PARTS = {
    "client_send": "client send",
    "network_and_server_send_recv": "network + server send/recv",
    "server_queue": "queue",
    "server_compute_input": "compute input",
    "server_compute_infer": "compute infer",
    "server_compute_output": "compute output",
    "client_recv": "client recv",
}


def average_us(split: dict) -> float:
    """The average latency: the sum of its parts."""
    return sum(split.values())


def table(rows: list[dict], level: str, level_words: str) -> list[str]:
    """A markdown table of the split in ms, one line per row that has one, `level` naming the row
    (row[level]: its concurrency, its request rate); [] where no row has a split."""
    split_rows = [row for row in rows if row.get("split_us")]
    if not split_rows:
        return []
    lines = [
        f"| {level_words} | " + " | ".join(PARTS.values()) + " | average |",
        "|---:|" + "---:|" * (len(PARTS) + 1),
    ]
    for row in split_rows:
        parts = " | ".join(f"{row['split_us'].get(part, 0) / 1000:.2f}" for part in PARTS)
        lines.append(f"| {row[level]:g} | {parts} | {average_us(row['split_us']) / 1000:.2f} |")
    return lines
