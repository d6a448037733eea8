"""`fab` looks for fabfile.py; the tasks live in tasks.py (`fab --list` shows them). Their collection
carries the `lab` defaults as its configuration (provision/config.py says why)."""

import os
import shutil
import sys

from tasks import help_asked_of_a_positional_task, ns  # noqa: F401

# `fab compare --help`: Invoke's parser takes the flag as the task's first positional argument (run_a)
# and answers that run_b is missing. Fabric has parsed its own options by the time this file is
# imported, so the one way left to show the help is to start again as `fab --help compare`.
_asked = help_asked_of_a_positional_task(sys.argv)
if _asked:
    fab = sys.argv[0] if os.path.exists(sys.argv[0]) else shutil.which(sys.argv[0])
    os.execv(sys.executable, [sys.executable, os.path.abspath(fab), *_asked[1:]])
