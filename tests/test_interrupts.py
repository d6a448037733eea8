"""Ctrl-C and SIGTERM are remembered: a KeyboardInterrupt that Python loses still stops the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from provision import ansible, interrupts


class SignalledWhileFinalized:
    """The signal arrives while the garbage collector runs this object's __del__ (as keystoneauth's
    Session.__del__ runs in the middle of a polling loop): Python prints the KeyboardInterrupt
    raised there as "Exception ignored" and goes on."""

    def __init__(self, signum: int):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        time.sleep(0.5)  # the handler runs here, inside __del__


# The lost KeyboardInterrupt is what pytest reports as an unraisable exception.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_whose_keyboard_interrupt_was_lost_still_stops_the_next_check(signum):
    with interrupts.handled():
        SignalledWhileFinalized(signum)  # collected at once: the KeyboardInterrupt is lost
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_if_requested()


def test_the_signal_is_forgotten_once_the_command_handled_it():
    before = {signum: signal.getsignal(signum) for signum in interrupts.SIGNALS}
    with pytest.raises(KeyboardInterrupt):
        with interrupts.handled():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    interrupts.raise_if_requested()  # the clean-up after an interrupt may call the cloud again
    assert {signum: signal.getsignal(signum) for signum in interrupts.SIGNALS} == before, "the handlers are restored"


def test_work_that_must_finish_ignores_signals_and_forgets_the_one_that_led_to_it():
    with interrupts.handled():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        with interrupts.refused("finishing"):
            interrupts.raise_if_requested()  # the first Ctrl-C does not stop the clean-up's waiting loops
            os.kill(os.getpid(), signal.SIGINT)  # a second one is refused
            time.sleep(0.5)
            interrupts.raise_if_requested()
            assert interrupts.refusing()
        with pytest.raises(KeyboardInterrupt):  # after the refusal, handled() answers again
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert not interrupts.refusing()


def test_what_a_cancelled_playbook_left_running_is_ended():
    # As an Ansible worker does: a session of its own, the run's mark on its command line,
    # and a task of its own below it that does not stop on SIGTERM.
    mark = "lab_playbook_run=test0123"
    worker = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[2:]); time.sleep(600)", mark,
         "sh", "-c", "trap '' TERM; sleep 600"],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while len(_descendants(worker.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        task = _descendants(worker.pid)
        assert task, "the worker's task did not start"
        ansible._end_leftovers(mark, grace=2)
        worker.wait(timeout=5)
        for pid in task:
            assert not _alive(pid), f"the worker's task {pid} is still running"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _descendants(pid: int) -> list[int]:
    done = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    children = [int(child) for child in done.stdout.split()]
    return children + [grandchild for child in children for grandchild in _descendants(child)]


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
