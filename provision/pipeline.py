"""fab run: the stages one after the other, then the teardown, however the stages ended.

A run is a few named stages (provision, deploy, bench), each a callable that
returns the results folder or None, and fails with invoke's Exit (the tasks'
clean failure, provision.errors' messages) or KeyboardInterrupt (Ctrl-C,
SIGTERM); anything else is a bug. tasks.py passes its own tasks; code that runs
the pipeline in-process (provision/demo.py, benchmarks/) can pass the same.

Once the stages have ended, the run finishes and a signal is refused from then
on: a bench that did not finish is marked partial (its folder's PARTIAL.md),
the teardown runs unless kept, and the last lines say how it all ended.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from invoke import Exit

from provision import interrupts, measure, targets
from provision import state as state_module

# The exit code of a command that Ctrl-C or SIGTERM ended (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130
INTERRUPTED_MESSAGE = "interrupted (Ctrl-C or SIGTERM)"
FINISHING = "fab run: teardown is finishing; it is not interrupted"

Stage = Callable[[], "Path | None"]


@dataclass
class Ending:
    """How a run ended: the stage that failed (None: all of them ran), its message and exit code."""

    failed: str | None = None
    message: str = ""
    code: int = 0
    bug: str = ""  # the traceback of a failure that is a bug in the project
    results: Path | None = None  # the bench's folder
    partial: list[measure.RunFolder] = field(default_factory=list)
    torn_down: str = ""  # what became of the deployment, in words


def run(
    stages: dict[str, Stage],
    teardown: Callable[[], None],
    settings: dict,
    keep: bool = False,
    release_lease: bool = False,
    say: Callable[[str], None] = print,
) -> Ending:
    """Run the stages in order until one fails, then finish (finish()); return how it ended."""
    runs_before = set(measure.runs(settings))
    ending = Ending()
    with interrupts.handled(), contextlib.ExitStack() as finishing:
        # Once the stages have ended, however they ended, the run finishes: a signal is refused
        # from the first statement on. Entered inside handled(), so no moment is left where
        # Python's own handler turns a Ctrl-C into exit 1.
        finish = functools.partial(finishing.enter_context, interrupts.refused(FINISHING))
        stage = next(iter(stages))
        try:
            for stage, step in stages.items():
                say(f"== fab run: {stage}")
                ending.results = step()
        except Exit as error:
            finish()
            ending.failed, ending.message, ending.code = stage, str(error.message or "failed"), error.code or 1
            print(ending.message, file=sys.stderr, flush=True)  # the stage's own words, before the teardown's
            if ending.code == INTERRUPTED:
                ending.message = INTERRUPTED_MESSAGE
        except KeyboardInterrupt:
            finish()
            ending.failed, ending.message, ending.code = stage, INTERRUPTED_MESSAGE, INTERRUPTED
        except Exception as error:  # a bug: the teardown runs all the same, the traceback comes after it
            finish()
            ending.failed, ending.message, ending.code = stage, f"{type(error).__name__}: {error}", 1
            ending.bug = traceback.format_exc()
        else:
            finish()
        return finish_run(ending, runs_before, teardown, settings, keep, release_lease, say)


def finish_run(
    ending: Ending,
    runs_before: set[Path],
    teardown: Callable[[], None],
    settings: dict,
    keep: bool,
    release_lease: bool,
    say: Callable[[str], None],
) -> Ending:
    """After the stages: mark a partial bench, tear down unless kept, say how it ended."""
    ending.partial = mark_unfinished(settings, runs_before, ending.message)
    ending.torn_down = "kept (--keep): `fab teardown` removes it"
    keep = keep or _waits_for_its_lease(ending, release_lease, say)
    if not keep and _nothing_provisioned():
        ending.torn_down = "never made: nothing was provisioned, so there is nothing to tear down"
    elif not keep:
        say("== fab run: teardown")
        try:
            teardown()
            ending.torn_down = "torn down"
        except Exit as error:
            ending.torn_down = f"not torn down: the teardown failed ({error.message}); run `fab teardown` again"
            ending.code = ending.code or 1
    _tell(ending, say)
    return ending


def _nothing_provisioned() -> bool:
    """Whether no state is recorded (a provision that failed before it made anything); a state file
    that cannot be read counts as provisioned: the teardown says what is wrong with it."""
    try:
        return state_module.load() is None
    except state_module.StateError:
        return False


def mark_unfinished(settings: dict, runs_before: set[Path], message: str) -> list[measure.RunFolder]:
    """The runs this one started that did not finish, each marked partial: a bench that did not finish
    wrote no summary; one the lease stopped marked itself."""
    started = [measure.RunFolder(folder) for folder in set(measure.runs(settings)) - runs_before]
    unfinished = [run for run in started if not run.is_complete()]
    for run in unfinished:
        if not run.is_partial():
            run.mark_partial(f"The bench did not finish: {message}")
    return unfinished


def _waits_for_its_lease(ending: Ending, release_lease: bool, say: Callable[[str], None]) -> bool:
    """Interrupted while it waits for a lease booked ahead, the run leaves the lease booked (the user may
    come back at its start), unless the run booked it and --release-lease asks to delete it."""
    state = state_module.load()
    if state is None or ending.code != INTERRUPTED:
        return False
    booked = targets.booked_ahead(state.target, state)
    if not booked:
        return False
    if release_lease and booked["ours"]:
        say(f"fab run: interrupted while waiting: deleting {booked['lease']}, as --release-lease asks")
        return False
    ending.torn_down = (
        f"not started: {booked['lease']} stays booked; `fab provision --target {state.target}` after its "
        "start continues, `fab teardown` releases it"
    )
    return True


def _tell(ending: Ending, say: Callable[[str], None]) -> None:
    """The run's last lines: where its results are, which stage failed and why, what became of the deployment."""
    if ending.results is not None:
        say(f"fab run: results in {ending.results}")
    for run in ending.partial:
        say(f"fab run: partial results in {run.path} (PARTIAL.md)")
    if not ending.failed:
        say(f"fab run: done; the deployment was {ending.torn_down}")
        return
    say(f"fab run: failed at {ending.failed}: {ending.message.splitlines()[0] if ending.message else ''}")
    say(f"fab run: the deployment was {ending.torn_down}")
    if ending.bug:
        print(f"fab run: this is a bug in the project; its traceback:\n{ending.bug}", file=sys.stderr)
