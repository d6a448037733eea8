"""Ctrl-C and SIGTERM during a long command: remembered, not only raised.

Python raises KeyboardInterrupt wherever the main thread is when the signal
comes. Inside a `__del__` method, that exception is printed as "Exception
ignored" and lost, and the command goes on as if nothing happened:
keystoneauth closes its HTTP sessions in `Session.__del__`, which the garbage
collector runs at any moment of a polling loop, so a Ctrl-C while a Chameleon
server builds was lost now and then. The handler therefore also sets a flag,
which the cloud calls and waiting loops check (`raise_if_requested`).

SIGTERM (a closed terminal, a batch scheduler, `kill`) does what Ctrl-C does.
Signal handlers can only be set in the main thread; elsewhere (a test calling
the code from a thread) `handled()` changes nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_requested = threading.Event()
_refusing = threading.Event()  # within refused(): playbooks must not be cancelled by a signal either


def _handler(signum, frame) -> None:
    _requested.set()
    raise KeyboardInterrupt


@contextmanager
def handled() -> Iterator[None]:
    """Within: SIGINT and SIGTERM raise KeyboardInterrupt and are remembered until the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested.clear()


def raise_if_requested() -> None:
    """KeyboardInterrupt if a signal came within `handled()`, even one whose exception was lost."""
    if _requested.is_set():
        raise KeyboardInterrupt


@contextmanager
def refused(message: str) -> Iterator[None]:
    """Within: SIGINT and SIGTERM print `message` and are otherwise ignored (work that must finish).

    Entered inside `handled()`, it must also be left inside it: `handled()` puts
    back the handlers it found when it ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def refuse(signum, frame) -> None:
        print(message, file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, refuse) for sig in SIGNALS}
    # A signal that `handled()` already answered is what led here (fab run's Ctrl-C before
    # its teardown): forgotten, so the waiting loops of the work that must finish go on.
    _requested.clear()
    _refusing.set()
    try:
        yield
    finally:
        _refusing.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def refusing() -> bool:
    """True within `refused()`."""
    return _refusing.is_set()
