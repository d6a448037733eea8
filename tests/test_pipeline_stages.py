"""How `fab run` ends, whatever its stages do: provision/pipeline.py with stand-in stages.

The real lifecycles (a run that succeeds, one Ctrl-C) are tests/test_run.py's;
here the stages are plain functions, so each way a stage can end is cheap to show.
"""

from __future__ import annotations

import os

import pytest
from invoke import Exit

import tasks
from provision import pipeline
from provision import state as state_module


@pytest.fixture
def settings(tmp_path, monkeypatch) -> dict:
    monkeypatch.setenv("LAB_STATE_FILE", str(tmp_path / "state" / "state.json"))  # no state: nothing booked ahead
    return {"results_dir": str(tmp_path / "results")}


def a_bug_in_the_bench():
    raise NotADirectoryError("[Errno 20] Not a directory: 'results'")


def provisioned() -> None:
    state_module.save(state_module.State(target="local"))


def stages(bench) -> dict:
    return {"provision": provisioned, "deploy": lambda: None, "bench": bench}


def test_a_bug_in_a_stage_ends_in_the_teardown_then_shows_its_traceback(settings, capsys):
    said, torn_down = [], []
    ending = pipeline.run(stages(a_bug_in_the_bench), lambda: torn_down.append(True), settings, say=said.append)
    assert torn_down == [True]
    assert (ending.failed, ending.code) == ("bench", 1)
    assert said[-2:] == [
        "fab run: failed at bench: NotADirectoryError: [Errno 20] Not a directory: 'results'",
        "fab run: the deployment was torn down",
    ]
    errors = capsys.readouterr().err
    assert "fab run: this is a bug in the project; its traceback:" in errors
    assert "a_bug_in_the_bench" in errors, "the traceback names where the bug is"


def test_a_bench_that_measured_nothing_ends_the_run_as_any_finished_bench(settings, tmp_path):
    """A bench whose windows never stabilised has finished: its report says what it could not measure
    (tests/test_faults.py, on a real server). The run names its folder, exits 0 and tears down."""
    folder = tmp_path / "results" / "20261208-000000-local"

    def measured_nothing() -> object:
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text('{"models": {}, "missing_levels": {"food_classifier": [2, 4]}}')
        return folder

    said, torn_down = [], []
    ending = pipeline.run(stages(measured_nothing), lambda: torn_down.append(True), settings, say=said.append)
    assert torn_down == [True] and (ending.failed, ending.code, ending.partial) == (None, 0, [])
    assert said[-2:] == [f"fab run: results in {folder}", "fab run: done; the deployment was torn down"]


def test_a_stage_s_clean_failure_is_no_bug(settings, capsys):
    def refused():
        raise Exit("error: --lb-node local: a node of its own for the balancer leaves no host to serve")

    said, torn_down = [], []
    ending = pipeline.run(stages(refused), lambda: torn_down.append(True), settings, say=said.append)
    assert torn_down == [True] and (ending.failed, ending.code) == ("bench", 1)
    assert "bug in the project" not in capsys.readouterr().err


def test_a_failed_teardown_says_to_run_it_again(settings):
    def teardown():
        raise Exit("the host did not answer")

    said = []
    ending = pipeline.run(stages(lambda: None), teardown, settings, say=said.append)
    assert ending.code == 1 and not ending.failed
    assert said[-1] == (
        "fab run: done; the deployment was not torn down: the teardown failed (the host did not answer); "
        "run `fab teardown` again"
    )


def test_a_provision_that_made_nothing_has_nothing_to_tear_down(settings):
    def no_credentials():
        raise Exit("error: no Chameleon credentials: set OS_AUTH_URL ...")

    said, torn_down = [], []
    ending = pipeline.run({"provision": no_credentials}, lambda: torn_down.append(True), settings, say=said.append)
    assert torn_down == [] and ending.code == 1
    assert "== fab run: teardown" not in said
    assert said[-1] == "fab run: the deployment was never made: nothing was provisioned, so there is nothing to tear down"


def test_an_output_whose_reader_went_away_does_not_stop_the_run():
    # `fab run | head -1`: once head exits, every write meets a broken pipe; the teardown must still run.
    reader, writer = os.pipe()
    os.close(reader)
    stream = tasks._PipeSafe(open(writer, "w"))  # noqa: SIM115 (closed by the test's end)
    assert stream.write("== fab run: teardown\n") == len("== fab run: teardown\n")
    stream.flush()
    stream.write("fab run: done\n")
