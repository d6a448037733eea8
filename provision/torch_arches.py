"""Which GPUs a torch build has kernels for, read from the build itself (no GPU needed).

`torch.cuda.get_arch_list()` cannot answer this where it matters: in torch 2.7
(the P100 pin, constraints/p100.txt) it returns [] whenever no GPU is visible,
and `docker build` never sees a GPU. The architectures compiled into the wheel
are what `torch._C._cuda_getArchFlags()` returns (torch 2.0 to 2.14 at least),
with or without a GPU.

Runs inside the Triton image (standard library and torch only), at two moments:

    python3 torch_arches.py build --require "sm_60"   # Dockerfile.triton, after pip install
    python3 torch_arches.py build --require ""        # a CPU image: nothing to check, said so
    python3 torch_arches.py gpus                      # the deploy, in the running container

`build` fails when the wheel has no kernels for a required architecture (the
host's GPUs, from the preflight); `gpus` fails when a GPU the container sees
has none, so a wrong pin stops the deploy with a message, not the first request.
provision/gpu_preflight.py uses runs_on() for the same rule on the controller.
"""

from __future__ import annotations

import argparse
import re
import sys


def runs_on(capability: tuple[int, int], arches: list[str]) -> bool:
    """Whether a build with these architectures has code for a GPU of this compute capability.

    A cubin for sm_XY runs on X.Z for every Z >= Y (same major); PTX for
    compute_XY is compiled by the driver for any capability >= X.Y.
    """
    major, minor = capability
    for arch in arches:
        match = re.fullmatch(r"(sm|compute)_(\d+?)(\d)a?", arch.strip())
        if match is None:
            continue
        kind, arch_major, arch_minor = match[1], int(match[2]), int(match[3])
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def capability_of(arch: str) -> tuple[int, int]:
    """sm_60 -> (6, 0)."""
    match = re.fullmatch(r"sm_(\d+?)(\d)", arch.strip())
    if match is None:
        raise ValueError(f"not a CUDA architecture: {arch!r} (expected e.g. sm_60)")
    return int(match[1]), int(match[2])


def compiled_arches(torch) -> list[str]:
    """The CUDA architectures compiled into this torch build; [] for a CPU build."""
    if getattr(torch.version, "cuda", None) is None:
        return []
    read_flags = getattr(torch._C, "_cuda_getArchFlags", None)
    if read_flags is None:  # a torch without the private reader: the public one (needs a GPU in 2.7)
        return list(torch.cuda.get_arch_list())
    return (read_flags() or "").split()


def check_build(torch, required: list[str]) -> tuple[bool, str]:
    """(ok, message): does the wheel carry kernels for every required architecture?"""
    if not required:
        return True, f"CPU image: no CUDA kernels to check (torch {torch.__version__})"
    arches = compiled_arches(torch)
    if not arches:
        return False, (
            f"torch {torch.__version__} has no CUDA kernels at all, but this host's GPUs need "
            f"{', '.join(required)}: install a CUDA build (the constraints and the torch index of lab.docker)"
        )
    missing = [arch for arch in required if not runs_on(capability_of(arch), arches)]
    if missing:
        return False, (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) has no {', '.join(missing)} kernels "
            f"(it has {' '.join(arches)}); for Pascal (sm_60) pin a cu126 build such as constraints/p100.txt"
        )
    return (
        True,
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) has kernels for {', '.join(required)}: {' '.join(arches)}",
    )


def check_gpus(torch) -> tuple[bool, str]:
    """(ok, message): does every GPU this process sees have kernels in the torch build?"""
    if not torch.cuda.is_available():
        return False, (
            f"torch {torch.__version__} sees no GPU in the Triton container although the host has GPUs: "
            "check the NVIDIA container toolkit (`docker run --rm --gpus all ... nvidia-smi`)"
        )
    arches = compiled_arches(torch)
    problems = []
    names = []
    for index in range(torch.cuda.device_count()):
        capability = tuple(torch.cuda.get_device_capability(index))
        name = torch.cuda.get_device_name(index)
        names.append(f"GPU {index} ({name}, {capability[0]}.{capability[1]})")
        if not runs_on(capability, arches):
            problems.append(
                f"GPU {index} ({name}, compute capability {capability[0]}.{capability[1]}) has no kernels in "
                f"torch {torch.__version__} (its architectures: {' '.join(arches) or 'none'}): "
                f"pin a torch build with sm_{capability[0]}{capability[1]}"
            )
    if problems:
        return False, "; ".join(problems)
    return True, f"torch {torch.__version__} has kernels for {', '.join(names)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="check the installed wheel against the architectures a host needs")
    build.add_argument("--require", default="", help='e.g. "sm_60" or "sm_60 sm_80"; empty: a CPU image')
    commands.add_parser("gpus", help="check every visible GPU against the installed wheel")
    args = parser.parse_args(argv)
    import torch  # here, not at the top: runs_on() is used where torch is not installed

    if args.command == "build":
        ok, message = check_build(torch, args.require.replace(",", " ").split())
    else:
        ok, message = check_gpus(torch)
    print(message if ok else f"error: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
