"""A state file that is not a state (hand-edited, truncated, another program's): every task
says so in one message that names the file, what is wrong and what to do; no traceback, and
the file is left exactly as it was."""

from __future__ import annotations

import json

import pytest
from support.lab import new_lab

GOOD_HOST = {"name": "local", "address": "127.0.0.1", "port": 22, "user": "", "key": None, "connection": "local"}
GOOD = {
    "version": 1, "target": "local", "hosts": [GOOD_HOST], "runtime": "process", "serving_venv": None,
    "chameleon": {}, "deploy": {}, "history": [],
}  # fmt: skip
LEASE_ID = "0b7c3f2e-1d5a-4e8b-9c6f-2a4d8e1f3b5c"
SERVER_ID = "5e2d9a1c-7b3f-4c8e-a6d1-9f0e2b4c6a8d"

MALFORMED = {
    "only a version": '{"version": 1}',
    "a list": "[]",
    "not JSON": '{"version": 1, "target": "loc',
    "a key removed by hand": json.dumps({k: v for k, v in GOOD.items() if k != "deploy"}),
    "a host without an address": json.dumps({**GOOD, "hosts": [{"name": "local"}]}),
    "a target of the wrong kind": json.dumps({**GOOD, "target": 3}),
}
WHAT_IS_WRONG = {
    "only a version": '"target" is missing; "hosts" is missing',
    "a list": "it holds a JSON list, not an object",
    "not JSON": "it is not valid JSON",
    "a key removed by hand": '"deploy" is missing',
    "a host without an address": 'host 1 has no "address"',
    "a target of the wrong kind": '"target" is 3, not a string',
}
TASKS = [
    ["status"], ["deploy"], ["bench", "--quick"], ["tune", "--model", "food_classifier", "--p99-ms", "100"],
    ["teardown"], ["run", "--quick"], ["extend"], ["logs"], ["provision"], ["tunnel"], ["ssh"],
]  # fmt: skip


def assert_one_clean_message(done, state_file, text: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert f"the state file {state_file} is not a state this code can read" in done.stderr
    assert f"mv {state_file} {state_file}.broken" in done.stderr
    assert state_file.read_text() == text, "a failed load changes nothing"


@pytest.mark.parametrize("malformation", list(MALFORMED))
def test_a_malformed_state_file_is_named_with_what_is_wrong(tmp_path, malformation):
    lab = new_lab(tmp_path)
    lab.state_file.parent.mkdir(parents=True)
    lab.state_file.write_text(MALFORMED[malformation])
    for task in (["status"], ["teardown"], ["run", "--quick"]):
        done = lab.fab(*task, check=False)
        assert_one_clean_message(done, lab.state_file, MALFORMED[malformation])
        assert WHAT_IS_WRONG[malformation] in done.stderr


def test_every_task_refuses_a_state_that_is_not_one(tmp_path):
    lab = new_lab(tmp_path)
    lab.state_file.parent.mkdir(parents=True)
    lab.state_file.write_text("[]")
    for task in TASKS:
        assert_one_clean_message(lab.fab(*task, check=False), lab.state_file, "[]")


def test_a_broken_chameleon_state_names_what_to_check_on_the_cloud(tmp_path):
    lab = new_lab(tmp_path)
    lab.state_file.parent.mkdir(parents=True)
    record = {
        "site": "CHI@TACC",
        "lease": {"name": "triton-lab-alice", "id": LEASE_ID},
        "servers": [{"name": "triton-lab-alice-1", "id": SERVER_ID}],
        "floating_ips": "129.114.0.1",  # hand-edited: not a list
    }
    text = json.dumps({**GOOD, "target": "chameleon", "hosts": [], "chameleon": record})
    lab.state_file.write_text(text)
    done = lab.fab("teardown", check=False)
    assert_one_clean_message(done, lab.state_file, text)
    assert '"chameleon.floating_ips" is not a list' in done.stderr
    assert f"lease triton-lab-alice (id {LEASE_ID}) at CHI@TACC" in done.stderr
    assert f"server triton-lab-alice-1 (id {SERVER_ID})" in done.stderr

    truncated = text[: text.index(SERVER_ID) + len(SERVER_ID)]  # cut short: the ids it still holds are named
    lab.state_file.write_text(truncated)
    done = lab.fab("status", check=False)
    assert_one_clean_message(done, lab.state_file, truncated)
    assert "it is not valid JSON" in done.stderr
    assert f"id {LEASE_ID}" in done.stderr and f"id {SERVER_ID}" in done.stderr
