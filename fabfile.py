"""`fab` looks for fabfile.py; the tasks live in tasks.py (`fab --list` shows them). Their collection
carries the `lab` defaults as its configuration (provision/config.py says why)."""

from tasks import ns  # noqa: F401
