"""Flags are checked before anything starts: one line naming the flag, what was given and what is
accepted, and nothing changed or written. `-h` is help on every task."""

from __future__ import annotations

import re
import subprocess

import pytest
from support.lab import FAB, new_lab

from provision.config import PROJECT_ROOT

BAD_FLAGS = [
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--concurrency", "2-4"],
     "--concurrency 2-4: give perf_analyzer's start:end:step, positive integers with start <= end"),
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--concurrency", "8:2"],
     "--concurrency 8:2: give perf_analyzer's start:end:step"),
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "abc"],
     "--p99-ms abc: give a number greater than 0 (milliseconds)"),
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--batch-sizes", "4,x"],
     "--batch-sizes 4,x: give comma-separated whole numbers of at least 1"),
    (["tune", "--model", "batching_food_classifier"], "--p99-ms is required: the latency budget"),
    (["tune", "--p99-ms", "100"], "--model is required: the model to tune"),
    (["tune", "--model", "nosuch_model", "--p99-ms", "100"], "--model nosuch_model: no such model; the models are"),
    (["bench", "--quick", "--model", "nosuch_model"], "--model nosuch_model: no such model; the models are"),
    (["bench", "--quick", "--model", "conditional_captioning"],
     "--model conditional_captioning: not measured: it takes a FOOD_LABEL beside its image, which the bench does "
     "not send; --model ensemble measures it"),
    (["provision", "--host", "nosuchhost"],
     "--host nosuchhost: a flag of the ssh target, and this provision is for the local target, which does not "
     "read it: add --target ssh, or leave --host out"),
    (["provision", "--target", "ssh", "--host", "h1", "--lease", "mine"],
     "--lease mine: a flag of the chameleon target, and this provision is for the ssh target"),
    (["run", "--key", "~/.ssh/id_ed25519"], "--key ~/.ssh/id_ed25519: a flag of the ssh and chameleon targets"),
    (["bench", "--scenario", "open_loop"], "--scenario open_loop: choose one of closed_loop, server"),
    (["bench", "--scenario", "server"], "--scenario server needs --p99-ms N: the p99 bound, in ms"),
    (["bench", "--p99-ms", "300"], "--p99-ms is the server scenario's bound: add --scenario server"),
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--scenario", "open_loop"],
     "--scenario open_loop: choose one of closed_loop, server"),
    # A number flag's value is a number (not Invoke's traceback), in its range (not a default in its place).
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--repeats", "abc"],
     "--repeats abc: give a whole number"),
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--repeats", "0"],
     "--repeats 0: give a whole number of at least 1 (measurements)"),
    (["tune", "--model", "batching_food_classifier", "--p99-ms", "100", "--max-gpus", "0"],
     "--max-gpus 0: give a whole number of at least 1 (GPUs)"),
    (["bench", "--scenario", "server", "--p99-ms", "abc"], "--p99-ms abc: give a number"),
    (["bench", "--scenario", "server", "--p99-ms", "-5"], "--p99-ms -5: give a number greater than 0 (milliseconds)"),
    (["logs", "--lines", "abc"], "--lines abc: give a whole number"),
    (["logs", "--lines", "-5"], "--lines -5: give a whole number of at least 1"),
    (["tunnel", "--offset", "abc"], "--offset abc: give a whole number"),
    (["extend", "--hours", "0"], "--hours 0: give a whole number of at least 1 (hours)"),
    (["compare", "a", "b", "--threshold", "-1"], "--threshold -1: give a fraction of at least 0"),
    (["provision", "--target", "chameleon", "--hours", "abc"], "--hours abc: give a number"),
    (["provision", "--target", "chameleon", "--hours", "0"],
     "lease length 0 h (--hours, lab.chameleon.lease_hours): choose more than 0 and at most 168 h"),
    (["provision", "--target", "chameleon", "--count", "0"], "node count 0 (--count, lab.chameleon.node_count)"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), BAD_FLAGS, ids=[" ".join(args[:1] + args[-2:]) for args, _ in BAD_FLAGS])
def test_a_bad_flag_is_named_before_anything_starts(tmp_path, args, message):
    lab = new_lab(tmp_path)
    done = lab.fab(*args, check=False)
    assert done.returncode == 1 and f"error: {message}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not lab.results_dir.exists() and lab.state() is None, "nothing written"


def task_names() -> list[str]:
    listing = subprocess.run([FAB, "--list"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout
    return re.findall(r"^  (\w[\w-]*) ", listing, flags=re.MULTILINE)  # continuation lines are indented further


def test_no_task_gives_minus_h_to_a_flag_and_every_flag_reads_cleanly():
    for task in task_names():
        text = subprocess.run([FAB, "--help", task], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout
        flags = re.findall(r"^\s+(-\S.*?)\s{2,}", text, flags=re.MULTILINE)
        assert f"Usage: fab [--core-opts] {task}" in text
        for line in flags:
            assert not line.startswith("-h"), f"{task}: {line}"
            assert not line.startswith("--="), f"{task}: a flag without a name: {line}"


@pytest.mark.parametrize(
    ("task", "flag"),
    [("run", "-h"), ("provision", "-h"), ("deploy", "-h"), ("bench", "-h"), ("teardown", "-h"),
     ("compare", "-h"), ("compare", "--help"), ("perf", "--help")],  # compare and perf take positional arguments
)  # fmt: skip
def test_minus_h_after_a_task_shows_its_help_and_does_nothing(tmp_path, task, flag):
    lab = new_lab(tmp_path)
    done = lab.fab(task, flag, check=False)
    assert done.returncode == 0 and f"Usage: fab [--core-opts] {task}" in done.stdout, done.stdout + done.stderr
    assert lab.state() is None, "nothing was provisioned"
