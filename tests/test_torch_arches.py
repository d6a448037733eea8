"""The torch architecture check of the Triton image (provision/torch_arches.py), run as the image runs it.

`docker build` has no GPU. The check must read what the wheel carries without
one: against the torch installed here (a CUDA 13 build, no GPU on this machine)
and against a stand-in torch that answers as torch 2.7.1 (the P100 pin) does
without a GPU: `get_arch_list()` returns [] while the compiled flags are there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.config import PROJECT_ROOT
from provision.torch_arches import runs_on

CHECK = PROJECT_ROOT / "provision" / "torch_arches.py"

# torch 2.7.1+cu126 (constraints/p100.txt): its compiled architectures, and
# `get_arch_list()` as its source has it: `if not is_available(): return []`.
STAND_IN_TORCH = """
import types
__version__ = "2.7.1+cu126"
version = types.SimpleNamespace(cuda={cuda!r})
_gpus = {gpus!r}  # [(name, (major, minor))]: what the container sees

def _arch_flags():
    return {flags!r}

_C = types.SimpleNamespace(_cuda_getArchFlags=_arch_flags)

def _is_available():
    return bool(_gpus)

def _get_arch_list():
    if not _is_available():
        return []
    return _arch_flags().split()

cuda = types.SimpleNamespace(
    is_available=_is_available,
    get_arch_list=_get_arch_list,
    device_count=lambda: len(_gpus),
    get_device_capability=lambda i: _gpus[i][1],
    get_device_name=lambda i: _gpus[i][0],
)
"""
P100_PIN_FLAGS = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"


def stand_in_torch(folder: Path, flags: str = P100_PIN_FLAGS, cuda: str | None = "12.6", gpus=()) -> dict:
    """An environment whose `import torch` is the stand-in."""
    package = folder / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(STAND_IN_TORCH.format(flags=flags, cuda=cuda, gpus=list(gpus)))
    return {**os.environ, "PYTHONPATH": str(folder)}


def run_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # As the image runs it: the file alone, by path, with the image's Python.
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_installed_torch_is_checked_without_a_gpu():
    import torch

    assert not torch.cuda.is_available(), "this machine has no GPU: the check must not need one"
    found = run_check("build", "--require", "sm_80", env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert found.returncode == 0, found.stderr
    assert "has kernels for sm_80" in found.stdout
    # torch's CUDA 13 wheels dropped Pascal: a P100 host is refused at build time, by name.
    refused = run_check("build", "--require", "sm_60", env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert refused.returncode == 1
    assert "has no sm_60 kernels" in refused.stderr and "constraints/p100.txt" in refused.stderr


def test_torch_2_7_without_a_gpu_passes_for_a_p100_although_get_arch_list_is_empty(tmp_path):
    env = stand_in_torch(tmp_path)
    empty = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_arch_list())"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert empty.stdout.strip() == "[]", "the stand-in answers as torch 2.7.1 does without a GPU"
    found = run_check("build", "--require", "sm_60", env=env)
    assert found.returncode == 0, found.stderr
    assert "torch 2.7.1+cu126 (CUDA 12.6) has kernels for sm_60" in found.stdout


def test_a_wheel_without_the_hosts_kernels_fails_the_build_and_names_them(tmp_path):
    env = stand_in_torch(tmp_path, flags="sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    refused = run_check("build", "--require", "sm_60", env=env)
    assert refused.returncode == 1
    assert "has no sm_60 kernels (it has sm_75 sm_80 sm_86 sm_90 sm_100 sm_120)" in refused.stderr


def test_a_cpu_image_skips_the_check_and_says_so(tmp_path):
    env = stand_in_torch(tmp_path, flags="", cuda=None)
    skipped = run_check("build", "--require", "", env=env)
    assert skipped.returncode == 0
    assert skipped.stdout.strip() == "CPU image: no CUDA kernels to check (torch 2.7.1+cu126)"


def test_a_cpu_build_of_torch_on_a_gpu_host_fails_the_build(tmp_path):
    env = stand_in_torch(tmp_path, flags="", cuda=None)
    refused = run_check("build", "--require", "sm_60", env=env)
    assert refused.returncode == 1 and "has no CUDA kernels at all" in refused.stderr


def test_on_the_node_every_visible_gpu_is_checked_against_the_wheel(tmp_path):
    p100s = [("Tesla P100-PCIE-16GB", (6, 0)), ("Tesla P100-PCIE-16GB", (6, 0))]
    fits = run_check("gpus", env=stand_in_torch(tmp_path / "pin", gpus=p100s))
    assert fits.returncode == 0, fits.stderr
    assert "GPU 0 (Tesla P100-PCIE-16GB, 6.0), GPU 1 (Tesla P100-PCIE-16GB, 6.0)" in fits.stdout

    wrong_pin = stand_in_torch(tmp_path / "cu128", flags="sm_75 sm_80 sm_90", gpus=p100s)
    refused = run_check("gpus", env=wrong_pin)
    assert refused.returncode == 1
    assert "GPU 0 (Tesla P100-PCIE-16GB, compute capability 6.0) has no kernels" in refused.stderr
    assert "pin a torch build with sm_60" in refused.stderr


def test_a_container_that_sees_no_gpu_on_a_gpu_host_points_to_the_toolkit(tmp_path):
    refused = run_check("gpus", env=stand_in_torch(tmp_path, gpus=[]))
    assert refused.returncode == 1 and "NVIDIA container toolkit" in refused.stderr


# The cubin rule (same major, lower or equal minor) is specified in tests/test_gpu_preflight.py,
# which reaches it through the preflight; PTX is what only the wheel's flags can carry.
@pytest.mark.parametrize(
    ("capability", "arches", "runs"),
    [
        ((12, 0), ["sm_90", "compute_90"], True),  # PTX is compiled by the driver for newer GPUs
        ((6, 0), ["compute_70"], False),
    ],
)
def test_ptx_runs_on_its_own_and_newer_gpus_only(capability, arches, runs):
    assert runs_on(capability, arches) is runs
