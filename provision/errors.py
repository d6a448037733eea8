"""The root of the errors that mean: tell the user, no traceback.

Every error the controller raises for the user derives from LabError: its
message says what happened and what to do. tasks.py turns a LabError into
"error: <message>" and exit 1 (provision.ansible.PlaybookInterrupted: exit 130);
anything else is a bug in the project and shows its traceback.

Code that runs on the hosts (provision/host/) imports nothing of the controller:
its errors reach the user through the playbook that ran it (PlaybookError).
"""

from __future__ import annotations


class LabError(Exception):
    """An error for the user: the message says what happened and what to do."""


class UsageError(LabError, ValueError):
    """What was asked cannot be done as asked: a flag, a setting, or the state of things (provisioned elsewhere)."""


class OperationError(LabError, RuntimeError):
    """Something the command did failed outside our control: a host, a cloud, a playbook, a measurement."""
