"""The test suite's budget of expensive operations, counted rather than timed.

Time is noisy on these machines; how many deploys, benches, tunes and whole
`fab run`s the suite makes is not. Every `fab` command a test runs through
support.lab.Lab is counted by kind (one line appended to the file named by
LAB_TEST_COUNTS, shared by the pytest-xdist workers); at the end of the session
the counts are printed beside the budget committed in pyproject.toml
([tool.lab.test_budget]) and the run fails when one is over. A test that needs
more raises its line in the same commit, with a comment saying why.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import tomllib

from provision.config import PROJECT_ROOT

COUNTS_VARIABLE = "LAB_TEST_COUNTS"


def kind(args: tuple[str, ...], runtime: str | None) -> str | None:
    """The budgeted kind of one `fab` command (None: cheap, not counted). A docker deploy builds images."""
    words = list(args)
    if words[:1] in (["-f"], ["--config"]):  # fab -f FILE TASK: a settings file before the task
        words = words[2:]
    task = next((word for word in words if not word.startswith("-")), "")
    if task == "deploy" and "--check" in args:
        return None
    if task == "deploy":
        return "deploy (docker runtime)" if runtime == "docker" else "deploy"
    return task if task in ("bench", "tune", "run") else None


def count(args: tuple[str, ...], runtime: str | None) -> None:
    """Record one `fab` command, where the session counts them."""
    counted, where = kind(args, runtime), os.environ.get(COUNTS_VARIABLE)
    if counted and where:
        with open(where, "a") as out:  # one short line in append mode: the workers' lines do not mix
            out.write(counted + "\n")


def counted(path: Path) -> Counter:
    return Counter(line.strip() for line in path.read_text().splitlines() if line.strip()) if path.exists() else Counter()


def budget(pyproject: Path = PROJECT_ROOT / "pyproject.toml") -> dict[str, int]:
    with open(pyproject, "rb") as file:
        return dict(tomllib.load(file)["tool"]["lab"]["test_budget"])


def report(counts: Counter, limits: dict[str, int]) -> tuple[list[str], list[str]]:
    """(a line per kind: its count and its budget; the kinds over the budget, in words)."""
    lines, over = [], []
    for name in sorted(set(limits) | set(counts)):
        used, most = counts.get(name, 0), limits.get(name)
        lines.append(f"  {name}: {used} (budget {most if most is not None else 'none'})")
        if most is None or used > most:
            over.append(f"{name}: {used} over the budget of {most if most is not None else 0}")
    return lines, over
