"""The docker runtime's GPU preflight decides, from one nvidia-smi answer, whether to go on.

The answers are recorded from real kinds of hosts (tests/data/nvidia_smi/); the
pinned images are those of provision/defaults.yaml (Triton 24.10, torch 2.7.1+cu126).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision import gpu_preflight
from provision.config import PROJECT_ROOT
from provision.config import settings as lab_settings

RECORDED = Path(__file__).parent / "data" / "nvidia_smi"
PINNED_TRITON = lab_settings()["docker"]["triton_image"]
PINNED_TORCH_ARCHES = lab_settings()["docker"]["torch_cuda_arches"]
# torch >= 2.8 with CUDA 12.8: what `pip install torch` gives today, without Pascal.
CU128_TORCH_ARCHES = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def recorded(case: str) -> dict:
    return json.loads((RECORDED / f"{case}.json").read_text())


def decide(case: str, triton_image: str = PINNED_TRITON, torch_arches: list[str] = PINNED_TORCH_ARCHES, pci: int = 1):
    """The verdict on a recorded answer, on a host with `pci` NVIDIA GPUs on its PCI bus."""
    answer = recorded(case)
    return gpu_preflight.decide(answer["rc"], answer["stdout"], answer["stderr"], triton_image, torch_arches, pci)


@pytest.mark.parametrize(
    ("case", "gpus", "model"),
    [("p100", 2, "Tesla P100-PCIE-16GB"), ("v100", 4, "Tesla V100-SXM2-32GB"), ("a100", 8, "NVIDIA A100-SXM4-40GB")],
)
def test_the_pinned_images_run_on_p100_v100_and_a100(case, gpus, model):
    verdict = decide(case)
    assert verdict.ok, verdict.message
    assert len(verdict.gpus) == gpus
    assert model in verdict.message and f"{gpus} GPU(s)" in verdict.message


def test_the_p100_answer_is_read_field_by_field():
    first = decide("p100").gpus[0]
    assert (first.index, first.name, first.compute_capability, first.driver_version, first.memory_mib) == (
        0, "Tesla P100-PCIE-16GB", "6.0", "560.35.03", 16384,
    )  # fmt: skip
    assert first.uuid.startswith("GPU-")


@pytest.mark.parametrize("case", ["none", "driver_missing"])
def test_a_host_without_nvidia_gpus_gets_cpu_images_in_one_line(case):
    verdict = decide(case, pci=0)
    assert verdict.ok and verdict.gpus == []
    assert verdict.message.startswith("no GPU: CPU images") and "\n" not in verdict.message


def test_gpus_on_the_pci_bus_that_the_driver_does_not_see_stop_the_deploy():
    verdict = decide("none", pci=2)
    assert not verdict.ok
    assert "the NVIDIA driver sees no GPU" in verdict.message and "the PCI bus has 2" in verdict.message


def test_gpus_without_a_driver_stop_and_name_the_cuda_image():
    verdict = decide("driver_missing", pci=2)
    assert not verdict.ok
    assert "no NVIDIA driver" in verdict.message and "CC-Ubuntu24.04-CUDA" in verdict.message


def test_a_driver_that_does_not_answer_stops_with_its_message():
    verdict = decide("driver_broken")
    assert not verdict.ok
    assert "exit 9" in verdict.message and "couldn't communicate with the NVIDIA driver" in verdict.message


def test_a_triton_release_without_pascal_support_is_refused_on_a_p100():
    verdict = decide("p100", triton_image="nvcr.io/nvidia/tritonserver:25.03-py3")
    assert not verdict.ok
    assert "needs compute capability >= 7.5" in verdict.message
    assert "tritonserver:24.10-py3" in verdict.message, "the message says what to pin instead"
    assert decide("a100", triton_image="nvcr.io/nvidia/tritonserver:25.03-py3").ok, "an A100 (8.0) is fine with it"


def test_a_torch_build_without_sm_60_kernels_is_refused_on_a_p100():
    verdict = decide("p100", torch_arches=CU128_TORCH_ARCHES)
    assert not verdict.ok
    assert "no kernels" in verdict.message and "no kernel image is available" in verdict.message
    assert decide("v100", torch_arches=CU128_TORCH_ARCHES).ok


def test_a_kernel_for_a_lower_minor_version_of_the_same_major_runs():
    assert gpu_preflight.torch_runs_on((6, 1), ["sm_60"])  # e.g. a GTX 1080 with the P100 build
    assert gpu_preflight.torch_runs_on((8, 9), ["sm_80", "sm_86"])
    assert not gpu_preflight.torch_runs_on((6, 0), ["sm_61", "sm_70"])
    assert not gpu_preflight.torch_runs_on((10, 0), PINNED_TORCH_ARCHES)


def test_a_driver_older_than_cuda_12_6_needs_is_refused():
    answer = recorded("v100")
    old = answer["stdout"].replace("535.183.01", "450.80.02")
    verdict = gpu_preflight.decide(0, old, "", PINNED_TRITON, PINNED_TORCH_ARCHES)
    assert not verdict.ok and "driver 450.80.02 is too old" in verdict.message


def test_the_role_asks_nvidia_smi_for_the_fields_the_decision_reads():
    tasks = yaml.safe_load((PROJECT_ROOT / "playbooks/roles/gpu_preflight/tasks/main.yml").read_text())
    assert tasks[0]["vars"]["gpu_preflight_query_args"] == list(gpu_preflight.QUERY_ARGS)


def test_the_command_line_prints_the_verdict_as_json():
    answer = recorded("p100")
    done = subprocess.run(
        [sys.executable, "-m", "provision.gpu_preflight", "--rc", "0", "--stdout", answer["stdout"],
         "--triton-image", PINNED_TRITON, "--torch-arches", ",".join(PINNED_TORCH_ARCHES)],
        capture_output=True, text=True, check=True, cwd=PROJECT_ROOT,
    )  # fmt: skip
    verdict = json.loads(done.stdout)
    assert verdict["ok"] and verdict["gpu_count"] == 2
    assert verdict["gpus"][1]["compute_capability"] == "6.0"
