"""How many NVIDIA GPUs a host has: the one fact the model configs depend on."""

from __future__ import annotations

import shutil
import subprocess


def count_gpus() -> int:
    """GPUs that `nvidia-smi -L` lists on this machine; 0 without a driver."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
