"""What a benchmark ran on: CPU, GPUs, Python, torch and Triton versions (one JSON object).

Runs on the serving host with the serving Python (standard library, plus torch
if it imports):  python -m provision.host.facts --triton-url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess

from provision.host.layout import http_json


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[dict]:
    query = "name,memory.total,driver_version,compute_cap"
    try:
        listing = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in listing.strip().splitlines():
        name, memory, driver, capability = (part.strip() for part in line.split(","))
        gpus.append({"name": name, "memory": memory, "driver": driver, "compute_capability": capability})
    return gpus


def _torch() -> dict:
    try:
        import torch
    except ImportError:
        return {"version": None}
    return {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}


def _triton(url: str) -> dict:
    status, metadata = http_json(f"{url}/v2")
    if status != 200 or not isinstance(metadata, dict):
        return {"version": None}
    return {"name": metadata.get("name"), "version": metadata.get("version")}


def collect(triton_url: str) -> dict:
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count()},
        "gpus": _gpus(),
        "python": platform.python_version(),
        "torch": _torch(),
        "triton": _triton(triton_url),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--triton-url", required=True)
    print(json.dumps(collect(parser.parse_args().triton_url)))


if __name__ == "__main__":
    main()
