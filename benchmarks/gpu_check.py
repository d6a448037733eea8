"""GPU check of the Food-11 classifier: raw in-process vs Triton-served throughput on CUDA.

One command, a few minutes, on a machine with an NVIDIA GPU, this checkout,
its .venv (a CUDA build of torch) and the local Triton runtime (`make runtime`):

    .venv/bin/python benchmarks/gpu_check.py               # GPU 0
    .venv/bin/python benchmarks/gpu_check.py --gpu-decode  # JPEGs decoded by nvJPEG
    .venv/bin/python benchmarks/gpu_check.py --cpu         # the same check on the CPU (a dry run)

It renders the repository for the host's GPUs with smoke weights, so
batching_food_classifier (dynamic batching) and gpu_food_classifier (one
request at a time) are KIND_GPU instances, then prints:

  raw        model.py's execute() in this process on cuda:0, batches of
             1, 4, 8, 16 and 32 one-image requests: images/s;
  served     perf_analyzer at concurrency 1, 8 and 16: infer/s;
  ratios     served/raw (batching c=8 over the best raw batch up to 16, the
             model's max_batch_size) and batching/no-batching;
  preprocess ms per image, seed path (CPU) vs the classifier's (device resize,
             and nvJPEG with --gpu-decode), small and phone-sized JPEGs.

Without a Triton runtime or perf_analyzer it prints the raw part and says
why the served part was skipped.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import classifier_throughput as bench  # noqa: E402 - the same raw/served machinery as on the CPU

from provision import config, sample_images, smoke_weights  # noqa: E402
from provision.host.tritonserver import TritonProcess, TritonRuntime, perf_analyzer_env  # noqa: E402
from provision.model_repo import RenderValues, render  # noqa: E402

BATCHING = "batching_food_classifier"
NO_BATCHING = "gpu_food_classifier"
RAW_BATCH_SIZES = (1, 4, 8, 16, 32)
MAX_BATCH = 16  # batching_food_classifier's max_batch_size: what a served batch can be


def rendered_config(repository: Path, model: str, kind: str) -> dict:
    """The model config as Triton would hand it to initialize(), read from the rendered pbtxt."""
    text = (repository / model / "config.pbtxt").read_text()
    parameters = {
        key: {"string_value": value}
        for key, value in re.findall(r'parameters \{ key: "([^"]+)" value \{ string_value: "([^"]*)" \} \}', text)
    }
    max_batch = int(re.search(r"^max_batch_size: (\d+)", text, re.M).group(1))
    return {
        "name": model,
        "max_batch_size": max_batch,
        "parameters": parameters,
        "instance_group": [{"count": 1, "kind": f"KIND_{kind}"}],
    }


def device_preprocessing_ms(version_dir: Path, weights: Path, device: str, gpu_decode: bool, seconds: float) -> dict:
    """ms per image to the network input, seed path vs the classifier's on `device`."""
    import torch

    bench.load_model_code(version_dir)
    classifier = sys.modules["food11"].Food11Classifier(weights, device=device, gpu_decode=gpu_decode)

    def ours(item):
        (prepared,) = classifier.prepare([item])
        if isinstance(prepared, Exception):
            raise prepared
        classifier.to_batch([prepared])
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    times = {}
    for name, size in (("small 512x384", sample_images.SMALL), ("phone 4000x3000", sample_images.PHONE)):
        item = sample_images.b64(sample_images.jpeg(size, seed=3))
        times[name] = {
            "seed_ms": 1000 * bench.time_per_call(lambda item=item: bench.seed_preprocess(item), seconds),
            "ours_ms": 1000 * bench.time_per_call(lambda item=item: ours(item), seconds),
        }
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (a dry run where there is no GPU)")
    parser.add_argument("--gpu-decode", action="store_true", help="render gpu_decode: true (nvJPEG)")
    parser.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer measurement window (ms)")
    parser.add_argument("--raw-seconds", type=float, default=3.0, help="time per raw batch size (s)")
    args = parser.parse_args(argv)

    import torch

    if args.cpu:
        gpus, kind, device = 0, "CPU", "cpu"
    elif torch.cuda.is_available():
        gpus, kind, device = torch.cuda.device_count(), "GPU", "cuda:0"
    else:
        sys.exit("torch sees no CUDA device: run with --cpu for a dry run, or on a GPU machine")
    started = time.monotonic()
    print(f"torch {torch.__version__}, device {device}", end="")
    print(f" ({torch.cuda.get_device_name(0)}, {gpus} GPU(s))" if gpus else "")
    print(bench.load_average(), flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    server = None
    try:
        smoke_weights.generate(scratch / "weights")
        weights = scratch / "weights" / smoke_weights.FOOD11_FILE
        settings = config.settings()
        settings["models"]["gpu_decode"] = args.gpu_decode
        values = RenderValues.from_settings(
            gpus, str(weights), str(scratch / "weights" / smoke_weights.BLIP_FOLDER), settings
        )
        rendered = scratch / "rendered"
        render(rendered, values)
        repository = scratch / "models"
        repository.mkdir()
        for model in (BATCHING, NO_BATCHING):
            shutil.copytree(rendered / model, repository / model)
        version_dir = repository / BATCHING / "1"
        images = [sample_images.jpeg(seed=seed) for seed in range(8)]

        raw = bench.raw_throughput(
            version_dir, rendered_config(repository, BATCHING, kind), images, args.raw_seconds, kind, RAW_BATCH_SIZES
        )
        preprocess = device_preprocessing_ms(version_dir, weights, device, args.gpu_decode, 1.5)

        served, skipped = {}, None
        runtime = TritonRuntime(config.runtime_dir() / "triton")
        if not runtime.manifest.exists():
            skipped = "no Triton runtime in .runtime/triton (`make runtime`)"
        elif not bench.PERF_ANALYZER.exists():
            skipped = f"no perf_analyzer at {bench.PERF_ANALYZER} (tritonclient wheel)"
        else:
            server = TritonProcess.on_free_ports(runtime.root, repository, scratch / "run")
            print(f"starting tritonserver ({bench.load_average()}) ...", flush=True)
            server.start([BATCHING, NO_BATCHING], timeout_s=240)
            input_json = bench.write_input_json(scratch / "input.json", images)
            env = perf_analyzer_env(runtime.root)
            for model in (BATCHING, NO_BATCHING):
                print(f"perf_analyzer {model} ...", flush=True)
                served[model] = bench.served_throughput(server, model, input_json, scratch, args.interval_ms, env)

        print()
        print(f"Food-11 classifier on {device} (smoke weights, 512x384 JPEGs; gpu_decode {args.gpu_decode})")
        print(f"  torch threads {raw['torch_threads']}; {bench.load_average()}")
        for batch_size, rate in raw["images_per_s"].items():
            print(f"  raw batch {batch_size:<3}            {rate:9.1f} img/s")
        for model, rates in served.items():
            for concurrency, rate in rates.items():
                print(f"  {model:<25} c={concurrency:<3} {rate:9.1f} infer/s")
        if skipped:
            print(f"  served: skipped, {skipped}")
        else:
            best = max((b for b in raw["images_per_s"] if b <= MAX_BATCH), key=raw["images_per_s"].get)
            print(
                f"  served/raw (batching c=8 / raw batch {best}):  {served[BATCHING][8] / raw['images_per_s'][best]:.2f}"
            )
            for concurrency in (8, 16):
                ratio = served[BATCHING][concurrency] / served[NO_BATCHING][concurrency]
                print(f"  batching/no-batching c={concurrency}:            {ratio:.2f}")
        for name, times in preprocess.items():
            print(
                f"  preprocess {name:<16} seed {times['seed_ms']:7.2f} ms, ours {times['ours_ms']:7.2f} ms "
                f"({times['seed_ms'] / times['ours_ms']:.1f}x)"
            )
        print(f"  done in {time.monotonic() - started:.0f} s")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
