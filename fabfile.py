"""`fab` looks for fabfile.py; the tasks live in tasks.py (`fab --list` shows them)."""

from tasks import bench, compare, deploy, extend, logs, provision, run, ssh, status, teardown, tune, tunnel  # noqa: F401
