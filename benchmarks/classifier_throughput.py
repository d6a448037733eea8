"""Food-11 classifier throughput: the raw in-process pipeline vs Triton-served, side by side.

One run on the local target measures, with smoke weights generated on the spot:

  raw        the classifier's own Triton code (model.py's execute(), which runs
             decoding + preprocessing + forward) called in this process, with
             the model config Triton passes it and the same torch thread
             count, on dynamic batches of 1, 4, 8 and 16 requests: images/s;
  served     perf_analyzer against a tritonserver this script starts on free
             ports: batching_food_classifier and food_classifier at
             concurrency 1, 8 and 16: infer/s (one image per request);
  ratios     served/raw (batching at concurrency 8 over the best raw batch)
             and batching/no-batching (at concurrency 8 and 16);
  preprocess ms per image from a JPEG file to the normalised network input,
             small (512x384) and phone-sized (4000x3000), the seed's path
             (PIL decode, Resize(256), CenterCrop(224), ToTensor, Normalize)
             vs the classifier's own;
  phone      4000x3000 JPEGs, smooth (~0.3 MB) and with a camera's grain
             (~3 MB, what phones send): served batching_food_classifier
             (the file's bytes, and base64) against two full-decode
             pipelines in this process, the seed's (each image alone: full
             decode, its transforms, forward) and ours with reduced_decoding
             off (model.py's execute() on batches, decoding on the thread
             pool), and against small images served; and where the
             time of one phone image goes (base64, JPEG decode full and
             reduced, resize, forward pass).

Every served request carries the image file's bytes (perf_analyzer's raw
input, as the seed's clients send), unless a figure says base64.

--baseline-ref REV also serves and runs the model code of git revision REV
(e.g. the commit before a change) in the same server and the same run, so a
before/after comparison sees the same machine load. Both versions are
rendered with this tree's settings; the baseline's models are served under
the prefix `baseline_`.

The machine is shared and noisy: the load average is printed before and
after, and perf_analyzer accepts its first windows (as tests/test_perf_analyzer.py
does) instead of waiting for a stability it may never see.

    .venv/bin/python benchmarks/classifier_throughput.py
    .venv/bin/python benchmarks/classifier_throughput.py --baseline-ref 11c7b03
"""

from __future__ import annotations

import argparse
import base64
import importlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from provision import config, sample_images, smoke_weights  # noqa: E402
from provision.host.tritonserver import TritonProcess, TritonRuntime, perf_analyzer_env  # noqa: E402
from provision.model_repo import RenderValues, render  # noqa: E402
from provision.perf import PerfRun, parse_csv, write_input_json  # noqa: E402

BATCHING = "batching_food_classifier"
NO_BATCHING = "food_classifier"
MODELS = (BATCHING, NO_BATCHING)
RAW_BATCH_SIZES = (1, 4, 8, 16)
CONCURRENCIES = (1, 8, 16)
PHONE_IMAGES = 4  # distinct 4000x3000 JPEGs cycled through
PHONE_GRAIN = 6  # grey levels of sensor noise: a 4000x3000 JPEG of ~3 MB, as phones write them
PHONE_CONCURRENCY = 8
PHONE_RAW_BATCH_SIZES = (1, 4, 8)
BASELINE_PREFIX = "baseline_"
PERF_ANALYZER = Path(sys.executable).parent / "perf_analyzer"  # from the tritonclient wheel
MODEL_MODULES = ("model", "food11", "serving_common", "triton_python_backend_utils")


# --------------------------------------------------------------------------- the raw pipeline


def fake_triton_utils() -> types.ModuleType:
    """The little of triton_python_backend_utils that the classifier's model.py uses.

    With it, model.py's initialize() and execute() run in this process exactly
    as in a Triton stub, minus Triton's shared-memory transport and HTTP.
    """
    module = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name, array):
            self._name, self._array = name, array

        def name(self):
            return self._name

        def as_numpy(self):
            return self._array

    class InferenceRequest:
        def __init__(self, inputs):
            self.inputs = {tensor.name(): tensor for tensor in inputs}

    class InferenceResponse:
        def __init__(self, output_tensors=(), error=None):
            self.output_tensors, self.error = list(output_tensors), error

        def has_error(self):
            return self.error is not None

    class TritonError(Exception):
        INVALID_ARG = 3

        def __init__(self, message, code=None):
            super().__init__(message)
            self.code = code

        def message(self):
            return str(self)

    class Logger:
        @staticmethod
        def log_info(message):
            pass

        log_warn = log_error = log_verbose = log_info

    module.Tensor = Tensor
    module.InferenceRequest = InferenceRequest
    module.InferenceResponse = InferenceResponse
    module.TritonError = TritonError
    module.Logger = Logger
    module.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    return module


def load_model_code(version_dir: Path) -> types.ModuleType:
    """Import model.py (and its food11, serving_common) from one rendered version folder."""
    for name in MODEL_MODULES:
        sys.modules.pop(name, None)
    sys.modules["triton_python_backend_utils"] = fake_triton_utils()
    sys.path.insert(0, str(version_dir))
    try:
        return importlib.import_module("model")
    finally:
        sys.path.remove(str(version_dir))


def raw_throughput(
    version_dir: Path,
    model_config: dict,
    items: list[bytes],
    seconds: float,
    kind: str = "CPU",
    batch_sizes: tuple[int, ...] = RAW_BATCH_SIZES,
) -> dict:
    """images/s of model.py's execute() on dynamic batches of `batch_sizes` one-image requests."""
    import torch

    module = load_model_code(version_dir)
    utils = sys.modules["triton_python_backend_utils"]
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(model_config),
            "model_name": model_config["name"],
            "model_instance_kind": kind,
            "model_instance_device_id": "0",
            "model_instance_name": f"{model_config['name']}_raw",
        }
    )
    result = {"torch_threads": torch.get_num_threads(), "images_per_s": {}}
    for batch_size in batch_sizes:
        requests = [
            utils.InferenceRequest([utils.Tensor("INPUT_IMAGE", np.array([[items[i % len(items)]]], dtype=np.object_))])
            for i in range(batch_size)
        ]
        responses = model.execute(requests)  # warm-up, and a check that the answers are answers
        failed = [r.error for r in responses if r.error is not None]
        if failed:
            raise RuntimeError(f"raw execute() failed: {failed[0]}")
        calls, start = 0, time.perf_counter()
        while True:
            model.execute(requests)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and calls >= 3:
                break
        result["images_per_s"][batch_size] = calls * batch_size / elapsed
    if hasattr(model, "finalize"):
        model.finalize()
    return result


# --------------------------------------------------------------------------- preprocessing


def seed_preprocess(item: bytes):
    """The seed's path: PIL decode, Resize(256), CenterCrop(224), ToTensor, Normalize."""
    from PIL import Image
    from torchvision import transforms

    transform = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    image = Image.open(io.BytesIO(item)).convert("RGB")  # the file's bytes, as the seed's clients send
    return transform(image).unsqueeze(0)


def ours_preprocess(classifier, item: bytes):
    """The classifier's own path from an INPUT_IMAGE item to its network input batch (reduced decoding on)."""
    if hasattr(classifier, "prepare"):  # the batch path model.py runs: prepare() then to_batch()
        (prepared,) = classifier.prepare([item])
        if isinstance(prepared, Exception):
            raise prepared
        return classifier.to_batch([prepared])
    # Model code without prepare_batch (the seed's): its model.py decodes and preprocesses per item.
    from serving_common import decode_image

    return classifier.preprocess(decode_image(item)).unsqueeze(0)


def time_per_call(function, seconds: float, minimum_calls: int = 3) -> float:
    """Median seconds per call over repeated calls (after one warm-up call)."""
    function()
    times, deadline = [], time.perf_counter() + seconds
    while len(times) < minimum_calls or time.perf_counter() < deadline:
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def preprocessing_times(version_dir: Path, weights: Path, seconds: float) -> dict:
    """ms per image, seed path vs the classifier's, for a small and a phone-sized JPEG."""
    load_model_code(version_dir)
    food11 = sys.modules["food11"]
    classifier = food11.Food11Classifier(weights)  # defaults: the current code decodes large JPEGs reduced
    times = {}
    for name, size in (("small 512x384", sample_images.SMALL), ("phone 4000x3000", sample_images.PHONE)):
        item = sample_images.jpeg(size, seed=3)
        times[name] = {
            "seed_ms": 1000 * time_per_call(lambda item=item: seed_preprocess(item), seconds),
            "ours_ms": 1000 * time_per_call(lambda item=item: ours_preprocess(classifier, item), seconds),
        }
    return times


# --------------------------------------------------------------------------- phone photos


PHONE_KINDS = {"smooth": 0, "grain": PHONE_GRAIN}  # name -> grain of sample_images.jpeg


def phone_photos(grain: float) -> list[bytes]:
    return [sample_images.jpeg(sample_images.PHONE, seed=20 + i, grain=grain) for i in range(PHONE_IMAGES)]


def full_decode_config(model_config: dict) -> dict:
    """The model config with reduced_decoding off: every JPEG decoded at full size, as the seed does."""
    changed = json.loads(json.dumps(model_config))
    changed.setdefault("parameters", {})["reduced_decoding"] = {"string_value": "false"}
    return changed


def seed_pipeline_throughput(version_dir: Path, weights: Path, photos: list[bytes], seconds: float) -> float:
    """images/s of the seed's model.py path: each image alone, full decode, the seed's transforms, forward."""
    import torch

    load_model_code(version_dir)
    classifier = sys.modules["food11"].Food11Classifier(weights, threads=torch.get_num_threads())
    calls, start = 0, time.perf_counter()
    with torch.inference_mode():
        while True:
            classifier.network(seed_preprocess(photos[calls % len(photos)]))
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and calls >= 3:
                break
    classifier.close()
    return calls / elapsed


def phone_breakdown(version_dir: Path, weights: Path, photo: bytes, seconds: float) -> dict[str, float]:
    """ms per step of one phone photo on one thread, in the order the served path takes them."""
    import torch

    load_model_code(version_dir)
    common, food11 = sys.modules["serving_common"], sys.modules["food11"]
    classifier = food11.Food11Classifier(weights, threads=1)  # reduced decoding on, as served
    text = base64.b64encode(photo)
    reduced = classifier.decode(photo)
    batch = classifier.to_batch([classifier._from_image(reduced)] * 8)
    steps = {
        "base64 decode (base64 input only)": lambda: base64.b64decode(text, validate=True),
        "JPEG decode, full size (the seed)": lambda: common.to_rgb(common.open_image(photo)),
        f"JPEG decode, reduced to {reduced.size[0]}x{reduced.size[1]}": lambda: classifier.decode(photo),
        "resize + crop of the reduced image": lambda: classifier._from_image(reduced),
        "forward pass, per image of a batch of 8": lambda: classifier.predict(batch),
    }
    with torch.inference_mode():
        times = {name: 1000 * time_per_call(step, seconds) for name, step in steps.items()}
    times["forward pass, per image of a batch of 8"] /= 8
    classifier.close()
    return times


def phone_figures(
    server: TritonProcess, version: Version, version_dir: Path, weights: Path, scratch: Path, args, env: dict
) -> dict:
    """Served and raw throughput on phone photos, and the per-step breakdown, for one version."""
    figures = {}
    config = model_config(server, version.served_name(BATCHING))
    for kind, grain in PHONE_KINDS.items():
        photos = phone_photos(grain)
        items = photos if version.encoding == "raw" else [base64.b64encode(photo) for photo in photos]
        print(f"[{version.label}] phone photos, {kind} ({load_average()}) ...", flush=True)
        full = raw_throughput(
            version_dir, full_decode_config(config), items, args.raw_seconds, batch_sizes=PHONE_RAW_BATCH_SIZES
        )["images_per_s"]
        reduced = raw_throughput(version_dir, config, items, args.raw_seconds, batch_sizes=PHONE_RAW_BATCH_SIZES)[
            "images_per_s"
        ]
        seed = seed_pipeline_throughput(version_dir, weights, photos, args.raw_seconds)
        served = {}
        for encoding in dict.fromkeys([version.encoding, "base64"]):
            input_json = write_input_json(scratch / f"phone-{kind}-{encoding}.json", photos, encoding=encoding)
            (served[encoding],) = served_throughput(
                server, version.served_name(BATCHING), input_json, scratch, args.interval_ms, env, (PHONE_CONCURRENCY,)
            ).values()
        figures[kind] = {
            "file_mb": sum(map(len, photos)) / len(photos) / 1e6,
            "seed_pipeline": seed,
            "raw_full_decode": full,
            "raw_reduced_decode": reduced,
            "served": served,
            "breakdown_ms": phone_breakdown(version_dir, weights, photos[0], args.preprocess_seconds),
        }
    return figures


# --------------------------------------------------------------------------- serving


@dataclass
class Version:
    """One version of the model code: where its source is and under which names it is served."""

    label: str
    source: Path
    prefix: str = ""
    results: dict = field(default_factory=dict)

    @property
    def encoding(self) -> str:
        """How its models take an image: "raw" (the file's bytes) where its code knows that form, else "base64"."""
        common = self.source / "food_classifier" / "1" / "serving_common.py"
        return "raw" if "def image_file_format" in common.read_text() else "base64"

    def served_name(self, model: str) -> str:
        return self.prefix + model


def extract_revision(revision: str, destination: Path) -> Path:
    """model_repository/ as it was at a git revision (links kept), under destination."""
    destination.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "archive", revision, "model_repository"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive, check=True)
    return destination / "model_repository"


def render_versions(versions: list[Version], values: RenderValues, repository: Path, scratch: Path) -> None:
    """Render every version and put its two classifier models into one servable repository."""
    repository.mkdir(parents=True)
    for index, version in enumerate(versions):
        rendered = scratch / f"rendered-{index}"
        render(rendered, values, source=version.source)
        for model in MODELS:
            target = repository / version.served_name(model)
            shutil.copytree(rendered / model, target)
            config_file = target / "config.pbtxt"
            text = config_file.read_text()
            config_file.write_text(re.sub(r'^name: ".*"$', f'name: "{target.name}"', text, count=1, flags=re.M))


def model_config(server: TritonProcess, model: str) -> dict:
    """The model config as JSON: what Triton hands to initialize()."""
    with urllib.request.urlopen(f"{server.url}/v2/models/{model}/config", timeout=10) as response:
        return json.loads(response.read())


def served_throughput(
    server: TritonProcess,
    model: str,
    input_json: Path,
    work: Path,
    interval_ms: int,
    env: dict,
    concurrencies: tuple[int, ...] = CONCURRENCIES,
) -> dict[int, float]:
    """infer/s of one model at `concurrencies` (one perf_analyzer run each)."""
    perf_analyzer = str(PERF_ANALYZER)
    throughput = {}
    for concurrency in concurrencies:
        run = PerfRun(
            model=model,
            url=f"{server.host}:{server.http_port}",
            input_json=input_json,
            csv_path=work / f"{model}-c{concurrency}.csv",
            concurrency_range=f"{concurrency}:{concurrency}:1",
            measurement_interval_ms=interval_ms,
            # Noisy shared machine: accept the first windows (perf_analyzer averages the last three).
            stability_percentage=999,
            max_trials=3,
        )
        run.run(perf_analyzer, env=env, timeout_s=300)
        (row,) = parse_csv(run.csv_path)
        throughput[concurrency] = row["throughput"]
    return throughput


# --------------------------------------------------------------------------- report


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def print_report(versions: list[Version], notes: list[str]) -> None:
    width = 24
    labels = [version.label for version in versions]
    print()
    print("Food-11 classifier throughput (smoke weights, one 512x384 JPEG per request, sent as the file's bytes)")
    for note in notes:
        print(f"  {note}")
    print()
    print(f"{'':<{width}}" + "".join(f"{label:>22}" for label in labels))
    print(f"{'torch threads':<{width}}" + "".join(f"{v.results['raw']['torch_threads']:>22}" for v in versions))
    for batch_size in RAW_BATCH_SIZES:
        row = f"raw batch {batch_size:<2} img/s"
        print(f"{row:<{width}}" + "".join(f"{v.results['raw']['images_per_s'][batch_size]:>22.1f}" for v in versions))
    for model in MODELS:
        for concurrency in CONCURRENCIES:
            row = f"{model.replace('_food_classifier', '')} c={concurrency} infer/s"
            print(f"{row:<{width}}" + "".join(f"{v.results['served'][model][concurrency]:>22.1f}" for v in versions))
    print()
    for version in versions:
        raw = version.results["raw"]["images_per_s"]
        served = version.results["served"]
        best_batch = max(raw, key=raw.get)
        ratios = {
            "served/raw (batching c=8 / best raw)": served[BATCHING][8] / raw[best_batch],
            "batching/no-batching c=8": served[BATCHING][8] / served[NO_BATCHING][8],
            "batching/no-batching c=16": served[BATCHING][16] / served[NO_BATCHING][16],
        }
        version.results["ratios"] = ratios
        print(f"{version.label}: best raw batch {best_batch} ({raw[best_batch]:.1f} img/s)")
        for name, value in ratios.items():
            print(f"  {name:<40} {value:6.2f}")
    print()
    for version in versions:
        if "phone" in version.results:
            print_phone(version)
    for version in versions:
        print(f"preprocessing, ms per image ({version.label}'s code):")
        print(f"  {'image':<18}{'seed path':>12}{'ours':>12}{'speed-up':>10}")
        for name, times in version.results["preprocess"].items():
            print(
                f"  {name:<18}{times['seed_ms']:>12.2f}{times['ours_ms']:>12.2f}"
                f"{times['seed_ms'] / times['ours_ms']:>9.1f}x"
            )


def print_phone(version: Version) -> None:
    """The phone-photo table of one version, with the two ratios the served path is held to."""
    small = version.results["served"][BATCHING][8]
    print(f"phone photos 4000x3000, batching_food_classifier ({version.label}'s code; images/s, infer/s):")
    kinds = list(version.results["phone"])
    print(f"  {'':<56}" + "".join(f"{kind:>10}" for kind in kinds))
    rows = {
        "JPEG size, MB": lambda f: f["file_mb"],
        "the seed's pipeline (full decode, one at a time)": lambda f: f["seed_pipeline"],
        "raw pipeline, full decode (best batch)": lambda f: max(f["raw_full_decode"].values()),
        "raw pipeline, reduced decode (best batch)": lambda f: max(f["raw_reduced_decode"].values()),
    }
    for encoding in version.results["phone"][kinds[0]]["served"]:
        words = "the file's bytes" if encoding == "raw" else "base64"
        rows[f"served c={PHONE_CONCURRENCY}, {words}"] = lambda f, e=encoding: f["served"][e]
    for name, value in rows.items():
        print(f"  {name:<56}" + "".join(f"{value(version.results['phone'][kind]):>10.2f}" for kind in kinds))
    ratios = {}
    for kind in kinds:
        figures = version.results["phone"][kind]
        served = figures["served"][version.encoding]
        ratios[kind] = {
            "served / the seed's pipeline (target >= 5)": served / figures["seed_pipeline"],
            "served / full-decode raw pipeline (target >= 5)": served / max(figures["raw_full_decode"].values()),
            f"served phone / served small ({small:.1f}/s; target >= 0.5)": served / small,
        }
        if "base64" in figures["served"] and version.encoding != "base64":
            ratios[kind]["served file's bytes / served base64"] = served / figures["served"]["base64"]
    for name in ratios[kinds[0]]:
        print(f"  {name:<56}" + "".join(f"{ratios[kind][name]:>10.2f}" for kind in kinds))
    version.results["phone_ratios"] = ratios
    print("  where one phone photo's time goes, ms on one thread:")
    for step in version.results["phone"][kinds[0]]["breakdown_ms"]:
        print(f"    {step:<54}" + "".join(f"{version.results['phone'][k]['breakdown_ms'][step]:>10.2f}" for k in kinds))
    print()


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-ref", help="also measure the model code of this git revision, side by side")
    parser.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer measurement window (ms)")
    parser.add_argument("--raw-seconds", type=float, default=4.0, help="time per raw batch size (s)")
    parser.add_argument("--preprocess-seconds", type=float, default=2.0, help="time per preprocessing figure (s)")
    parser.add_argument("--images", type=int, default=8, help="distinct 512x384 JPEGs cycled through")
    parser.add_argument("--torch-threads", type=int, help="render this torch_threads (default: the lab settings)")
    parser.add_argument("--no-phone", action="store_true", help="leave out the phone-photo figures (about 3 minutes)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (repository, CSVs, log)")
    args = parser.parse_args(argv)

    runtime = TritonRuntime(config.runtime_dir() / "triton")
    if not runtime.manifest.exists():
        sys.exit("no Triton runtime in .runtime/triton: run `make runtime` first")

    scratch = Path(tempfile.mkdtemp(prefix="classifier-bench-"))
    server = None
    notes = [f"host: {os.cpu_count()} CPUs; before: {load_average()}"]
    try:
        smoke_weights.generate(scratch / "weights")
        food11_weights = scratch / "weights" / smoke_weights.FOOD11_FILE
        settings = config.settings()
        if args.torch_threads is not None:
            settings["models"]["torch_threads"] = args.torch_threads
        values = RenderValues.from_settings(
            0, str(food11_weights), str(scratch / "weights" / smoke_weights.BLIP_FOLDER), settings
        )
        versions = [Version("current tree", config.MODEL_REPOSITORY)]
        if args.baseline_ref:
            source = extract_revision(args.baseline_ref, scratch / "baseline-source")
            versions.insert(0, Version(f"baseline {args.baseline_ref}", source, prefix=BASELINE_PREFIX))
        repository = scratch / "models"
        render_versions(versions, values, repository, scratch)

        server = TritonProcess.on_free_ports(runtime.root, repository, scratch / "run")
        print(f"starting tritonserver on port {server.http_port} ({load_average()}) ...", flush=True)
        server.start([v.served_name(m) for v in versions for m in MODELS], timeout_s=300)

        images = [sample_images.jpeg(seed=seed) for seed in range(args.images)]
        env = perf_analyzer_env(runtime.root)

        for version in versions:
            version_dir = repository / version.served_name(BATCHING) / "1"
            items = images if version.encoding == "raw" else [base64.b64encode(image) for image in images]
            print(f"[{version.label}] raw pipeline ({load_average()}) ...", flush=True)
            version.results["raw"] = raw_throughput(
                version_dir, model_config(server, version.served_name(BATCHING)), items, args.raw_seconds
            )
            print(f"[{version.label}] preprocessing ({load_average()}) ...", flush=True)
            version.results["preprocess"] = preprocessing_times(version_dir, food11_weights, args.preprocess_seconds)
        for version in versions:
            version.results["encoding"] = version.encoding
            input_json = write_input_json(scratch / f"input-{version.encoding}.json", images, encoding=version.encoding)
            version.results["served"] = {}
            for model in MODELS:
                print(f"[{version.label}] perf_analyzer {model} ({load_average()}) ...", flush=True)
                version.results["served"][model] = served_throughput(
                    server, version.served_name(model), input_json, scratch, args.interval_ms, env
                )
        if not args.no_phone:
            for version in versions:
                version_dir = repository / version.served_name(BATCHING) / "1"
                version.results["phone"] = phone_figures(
                    server, version, version_dir, food11_weights, scratch, args, env
                )
        notes.append(f"after: {load_average()}")
        print_report(versions, notes)
        if args.json:
            args.json.write_text(
                json.dumps({"notes": notes, "versions": {v.label: v.results for v in versions}}, indent=2) + "\n"
            )
    finally:
        if server is not None:
            server.stop()
        if args.keep:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
