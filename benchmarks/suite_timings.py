"""docs/testing.md's table of where `make test` spends its time, written from a measured run.

    make test PYTEST_ARGS="--durations=0" LAB_FAB_TIMINGS=/tmp/fab.txt 2>&1 | tee /tmp/make-test.log
    .venv/bin/python benchmarks/suite_timings.py /tmp/make-test.log /tmp/fab.txt [COMMIT]

Reads pytest's --durations report (every phase of every test: setup, call,
teardown) and the LAB_FAB_TIMINGS file (one line per `fab` command the tests
ran, tests/support/lab.py), and replaces the part of docs/testing.md between
its two timing markers with: pytest's wall time (COMMIT: the commit measured, when
it is not HEAD), the seconds per test file
(summed over the workers), and the seconds and count per `fab` task, headed by
the commit and the date. Nothing here is typed by hand.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- test timings: written by benchmarks/suite_timings.py -->", "<!-- end of test timings -->"
DURATION = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(tests/[^:\s]+)::\S*", re.M)
WALL = re.compile(r"make test: pytest took ([0-9]+) s")
SUMMARY = re.compile(r"=+ (.*(?:passed|failed).*) in [0-9.]+s")
FAB_LINE = re.compile(r"^\s*([0-9.]+)s\s+\S*\s+fab (?:-f \S+ )?(\S+)", re.M)  # the task, after a `-f FILE`


def per_file(log: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for value, _, path in DURATION.findall(log):
        seconds[path] += float(value)
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def per_task(fab_lines: str) -> dict[str, tuple[int, float]]:
    found: dict[str, list[float]] = defaultdict(list)
    for value, task in FAB_LINE.findall(fab_lines):
        found[task].append(float(value))
    return {task: (len(values), sum(values)) for task, values in sorted(found.items(), key=lambda item: -sum(item[1]))}


def table(log: str, fab_lines: str, commit: str, day: str) -> list[str]:
    wall = WALL.search(log)
    summary = SUMMARY.findall(log)
    files, tasks = per_file(log), per_task(fab_lines)
    lines = [
        BEGIN,
        f"Measured on {commit[:7]}, {day}: `make test` took {wall.group(1) if wall else '?'} s of pytest"
        + (f" ({summary[-1]})" if summary else "")
        + "; both workers' seconds are summed below, so the sums exceed the wall time.",
        "",
        "| test file | seconds |",
        "|---|---:|",
        *[f"| {path.removeprefix('tests/')} | {seconds:.0f} |" for path, seconds in files.items()],
        f"| all | {sum(files.values()):.0f} |",
        "",
        "| fab task the tests ran | times | seconds |",
        "|---|---:|---:|",
        *[f"| {task} | {count} | {seconds:.0f} |" for task, (count, seconds) in tasks.items()],
        END,
    ]
    return lines


def main() -> None:
    log_path, fab_path = (Path(arg) for arg in sys.argv[1:3])
    asked = sys.argv[3] if len(sys.argv) > 3 else "HEAD"
    commit = subprocess.run(["git", "rev-parse", asked], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = table(log_path.read_text(errors="replace"), fab_path.read_text(), commit, time.strftime("%Y-%m-%d"))
    text = DOC.read_text()
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + "\n".join(lines) + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Where `make test` spends its time\n\n" + "\n".join(lines) + "\n"
    DOC.write_text(text)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
