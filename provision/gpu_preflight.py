"""The GPU preflight of the docker runtime: can the pinned images run on this host's GPUs?

Decided from one read-only `nvidia-smi` query, before anything is installed or
built, so that a wrong node type or a broken driver costs seconds, not the
20 minutes of a Triton image build:

- a host with no NVIDIA GPU on its PCI bus gets CPU images (the models run as
  CPU instances, as in the process runtime): nothing to check;
- on a host with NVIDIA GPUs the driver must be present and answer
  (`nvidia-smi` found, exit 0) and list them;
- every GPU's compute capability must be supported by the Triton image
  (NGC 25.03 and later need >= 7.5; 24.10, our pin, runs on 6.0) and have
  kernels in the torch build (torch's CUDA 12.8 wheels dropped sm_60, which is
  why constraints/p100.txt pins a cu126 build);
- the driver must be new enough for the image's CUDA (24.10: CUDA 12.6, driver
  560, or a data-center branch with forward compatibility).

The role playbooks/roles/gpu_preflight runs the query on the host and this
module on the controller:

    python -m provision.gpu_preflight --rc 0 --stdout "$(nvidia-smi --query-gpu=... )" \\
        --nvidia-pci-devices 2 --triton-image nvcr.io/nvidia/tritonserver:24.10-py3 --torch-arches sm_50,sm_60,...

It prints one JSON object: {"ok": bool, "message": str, "gpus": [...], "gpu_count": N}.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass

from provision.errors import UsageError
from provision.torch_arches import runs_on as torch_runs_on

# The query the role runs (the order of the fields is what parse() reads).
QUERY_FIELDS = ("index", "name", "uuid", "compute_cap", "driver_version", "memory.total")
QUERY_ARGS = (f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader")

# Triton releases (NGC YY.MM tags) and what they need. From NVIDIA's support
# matrix: 25.03 dropped compute capabilities below 7.5; 24.10 is built on
# CUDA 12.6 (driver >= 560, or one of the data-center branches below with the
# CUDA forward-compatibility package the image carries).
TRITON_MIN_CAPABILITY_FROM_2503 = (7, 5)
TRITON_MIN_CAPABILITY_BEFORE_2503 = (6, 0)
TRITON_MIN_DRIVER = 560
FORWARD_COMPATIBLE_DRIVER_BRANCHES = (470, 525, 535, 545)


class PreflightError(UsageError):
    """nvidia-smi's answer cannot be read at all."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    compute_capability: str  # "6.0"
    driver_version: str  # "560.35.03"
    memory_mib: int

    @property
    def capability(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".")[0])


@dataclass
class Verdict:
    ok: bool
    message: str
    gpus: list[Gpu]

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "message": self.message,
            "gpu_count": len(self.gpus),
            "gpus": [asdict(g) for g in self.gpus],
        }


def parse(stdout: str) -> list[Gpu]:
    """The GPUs in the CSV answer of `nvidia-smi QUERY_ARGS` (exit status 0)."""
    gpus = []
    for line in stdout.strip().splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != len(QUERY_FIELDS):
            raise PreflightError(f"unexpected nvidia-smi line {line!r} (expected {', '.join(QUERY_FIELDS)})")
        index, name, uuid, capability, driver, memory = parts
        if not re.fullmatch(r"\d+\.\d+", capability):
            raise PreflightError(f"GPU {index} ({name}) reports compute capability {capability!r}")
        gpus.append(Gpu(int(index), name, uuid, capability, driver, int(memory.split()[0])))
    return gpus


def triton_min_capability(triton_image: str) -> tuple[int, int]:
    """The lowest compute capability an NGC tritonserver image (tag YY.MM-...) supports."""
    match = re.search(r":(\d{2})\.(\d{2})", triton_image)
    if match is None:  # an image of the user's own: trust it as far as Triton goes
        return TRITON_MIN_CAPABILITY_BEFORE_2503
    return (
        TRITON_MIN_CAPABILITY_FROM_2503
        if (int(match[1]), int(match[2])) >= (25, 3)
        else TRITON_MIN_CAPABILITY_BEFORE_2503
    )


def _fmt(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


CPU_IMAGES = "no GPU: CPU images"


def decide(
    rc: int,
    stdout: str,
    stderr: str,
    triton_image: str,
    torch_arches: list[str],
    nvidia_pci_devices: int = 1,
) -> Verdict:
    """The preflight's decision on one nvidia-smi answer (rc, stdout, stderr).

    nvidia_pci_devices: the NVIDIA display controllers on the host's PCI bus. With
    none, a missing driver or an empty GPU list means a CPU host, not a fault.
    """
    output = f"{stdout}\n{stderr}".strip()
    if nvidia_pci_devices == 0 and (rc == 127 or "No devices were found" in output):
        where = "nvidia-smi not found" if rc == 127 else "nvidia-smi: No devices were found"
        return Verdict(
            True, f"{CPU_IMAGES} (no NVIDIA GPU on the PCI bus; {where}): the models run as CPU instances", []
        )
    if rc == 127:  # the role's shell: command -v nvidia-smi failed
        return Verdict(
            False,
            f"no NVIDIA driver on this host (nvidia-smi not found, {nvidia_pci_devices} NVIDIA GPU(s) on the PCI bus): "
            "use a CUDA image (CC-Ubuntu24.04-CUDA on Chameleon) or install the driver",
            [],
        )
    if "No devices were found" in output:
        return Verdict(
            False,
            f"the NVIDIA driver sees no GPU on this host (nvidia-smi: No devices were found), but the PCI bus "
            f"has {nvidia_pci_devices}: reload the driver or reboot; check the node type (gpu_p100 on Chameleon)",
            [],
        )
    if "is not a valid field" in output:
        return Verdict(False, f"the NVIDIA driver is too old to report compute capability (needs >= 510): {output}", [])
    if rc != 0:
        return Verdict(
            False,
            f"the NVIDIA driver does not work (nvidia-smi exit {rc}): {output[:500]} -- "
            "a reboot after a driver update usually fixes this",
            [],
        )
    gpus = parse(stdout)
    if not gpus:
        return Verdict(False, "nvidia-smi lists no GPU on this host: check the node type", [])

    problems = [problem for gpu in gpus for problem in gpu_problems(gpu, triton_image, torch_arches)]
    if problems:
        return Verdict(False, "the GPUs of this host cannot run the pinned images:\n- " + "\n- ".join(problems), gpus)
    names = sorted({gpu.name for gpu in gpus})
    return Verdict(
        True,
        f"{len(gpus)} GPU(s): {', '.join(names)}; compute capability "
        f"{', '.join(sorted({gpu.compute_capability for gpu in gpus}))}; driver {gpus[0].driver_version}",
        gpus,
    )


def gpu_problems(gpu, triton_image: str, torch_arches: list[str]) -> list[str]:
    """Why one GPU cannot run the pinned images: its compute capability, the torch build's kernels, its driver."""
    problems = []
    needed = triton_min_capability(triton_image)
    label = f"GPU {gpu.index} ({gpu.name}, compute capability {gpu.compute_capability})"
    if gpu.capability < needed:
        problems.append(
            f"{label}: {triton_image} needs compute capability >= {_fmt(needed)}; "
            "pin nvcr.io/nvidia/tritonserver:24.10-py3 (the last release for 6.0)"
            if needed > TRITON_MIN_CAPABILITY_BEFORE_2503
            else f"{label}: {triton_image} needs compute capability >= {_fmt(needed)}"
        )
    if not torch_runs_on(gpu.capability, torch_arches):
        problems.append(
            f"{label}: the pinned torch build has no kernels for it (its architectures: "
            f"{', '.join(torch_arches)}); torch would fail with 'no kernel image is available'"
        )
    driver = gpu.driver_major
    if driver < TRITON_MIN_DRIVER and driver not in FORWARD_COMPATIBLE_DRIVER_BRANCHES:
        problems.append(
            f"{label}: driver {gpu.driver_version} is too old for {triton_image} (CUDA 12.6 needs driver >= "
            f"{TRITON_MIN_DRIVER}, or a data-center branch {', '.join(map(str, FORWARD_COMPATIBLE_DRIVER_BRANCHES))})"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rc", type=int, required=True, help="nvidia-smi's exit status")
    parser.add_argument("--stdout", default="", help="its standard output")
    parser.add_argument("--stderr", default="", help="its standard error (or Ansible's message)")
    parser.add_argument("--nvidia-pci-devices", type=int, default=1, help="NVIDIA display controllers on the PCI bus")
    parser.add_argument("--triton-image", required=True)
    parser.add_argument("--torch-arches", required=True, help="comma-separated, e.g. sm_50,sm_60,sm_70")
    args = parser.parse_args(argv)
    try:
        verdict = decide(
            args.rc, args.stdout, args.stderr, args.triton_image, args.torch_arches.split(","), args.nvidia_pci_devices
        )
    except PreflightError as error:
        verdict = Verdict(False, f"cannot read nvidia-smi's answer: {error}", [])
    print(json.dumps(verdict.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
