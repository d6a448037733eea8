"""Ctrl-C and SIGTERM are remembered: a KeyboardInterrupt that Python loses still stops the command."""

from __future__ import annotations

import os
import signal
import time

import pytest

from provision import interrupts


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
