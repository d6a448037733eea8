"""How long tritonserver takes to start with every model READY: our configs completed by the server, or not.

    .venv/bin/python benchmarks/server_start.py [--repeat 2]

The rendered model repository (smoke weights, every model, as deployed on a
host without GPUs), started the way both runtimes start it (provision/host/
tritonserver.py MODEL_LOADING: --disable-auto-complete-config) and, beside
it, with the server's default, where the python backend starts one stub
process per model (torch imported) to complete each config before the
model's instances start their own. Alternates the two, `--repeat` times each,
and prints the seconds of each start and the ratio of the medians.

The machine is noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision import config, smoke_weights  # noqa: E402
from provision.host.tritonserver import TritonProcess, TritonRuntime  # noqa: E402
from provision.model_repo import RenderValues, model_names, render  # noqa: E402

NO_AUTO_COMPLETE = "--disable-auto-complete-config"


class CompletingServer(TritonProcess):
    """The server as its default has it: every config completed by the backend first."""

    def command(self) -> list[str]:
        return [arg for arg in super().command() if arg != NO_AUTO_COMPLETE]


def start_seconds(kind: type[TritonProcess], repository: Path, state: Path) -> float:
    server = kind.on_free_ports(TritonRuntime(config.runtime_dir() / "triton").root, repository, state)
    started = time.monotonic()
    try:
        server.start(model_names(), timeout_s=600)
        return time.monotonic() - started
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="server-start-") as folder:
        work = Path(folder)
        smoke_weights.generate(work / "weights")
        render(
            work / "models",
            RenderValues(
                gpu_count=0,
                food11_weights_path=str(work / "weights" / smoke_weights.FOOD11_FILE),
                blip_source=str(work / "weights" / smoke_weights.BLIP_FOLDER),
                reduced_decoding=True,
            ),
        )
        kinds = {"as deployed (configs not completed)": TritonProcess, "server default (completed)": CompletingServer}
        seconds: dict[str, list[float]] = {name: [] for name in kinds}
        print(f"{len(model_names())} models, {os.cpu_count()} CPUs: seconds from launch to every model READY")
        for attempt in range(1, args.repeat + 1):
            for name, kind in kinds.items():
                seconds[name].append(start_seconds(kind, work / "models", work / f"state-{attempt}-{kind.__name__}"))
                print(f"run {attempt} {name}: {seconds[name][-1]:.1f} s")
        deployed, default = (statistics.median(values) for values in seconds.values())
        print(f"median: as deployed {deployed:.1f} s, server default {default:.1f} s; ratio {deployed / default:.2f}")


if __name__ == "__main__":
    main()
