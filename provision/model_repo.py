"""Render model_repository/ into the repository one host serves.

The source tree keeps one copy of everything: the classifier variants link to
food_classifier/1/*.py, and every config is a jinja2 template
(config.pbtxt.j2) whose host-dependent parts (GPU instance groups, weight
paths) are filled in here. The rendered tree has plain files only, so it can
be copied anywhere (a container volume, a remote host).

    python -m provision.model_repo render DEST --gpus 0 --food11-weights W --blip-source B
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import jinja2

from provision.config import MODEL_REPOSITORY
from provision.config import settings as lab_settings
from provision.smoke_weights import is_smoke

TEMPLATE_SUFFIX = ".j2"


@dataclass(frozen=True)
class RenderValues:
    """Everything a model config depends on."""

    gpu_count: int
    food11_weights_path: str
    blip_source: str
    instances_per_gpu: int = 1
    # 0: each classifier instance takes the serving host's CPUs divided by the
    # model's instance count (decided on that host, in model.py).
    torch_threads: int = 0
    # Decode large JPEGs at reduced size (the classifier's tolerance is in
    # tests/test_preprocessing.py). Off unless asked: fabric.yaml turns it on.
    reduced_decoding: bool = False
    # GPU instances: decode JPEGs with nvJPEG (torchvision.io.decode_jpeg on CUDA).
    gpu_decode: bool = False
    max_encoded_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    # None: detect from the weights' SMOKE_WEIGHTS markers. Set it when the
    # paths are those of another host, where this machine cannot look.
    smoke: bool | None = None

    @property
    def smoke_weights(self) -> bool:
        if self.smoke is not None:
            return self.smoke
        return is_smoke(self.food11_weights_path) or is_smoke(self.blip_source)

    def context(self) -> dict:
        return {**asdict(self), "smoke_weights": self.smoke_weights}

    @classmethod
    def from_settings(
        cls,
        gpu_count: int,
        food11_weights_path: str,
        blip_source: str,
        settings: dict | None = None,
        smoke: bool | None = None,
    ):
        """Values from the `lab` settings (fabric.yaml and its overrides)."""
        models = (settings or lab_settings())["models"]
        return cls(
            smoke=smoke,
            gpu_count=gpu_count,
            food11_weights_path=str(food11_weights_path),
            blip_source=str(blip_source),
            instances_per_gpu=int(models["instances_per_gpu"]),
            torch_threads=int(models["torch_threads"]),
            reduced_decoding=bool(models.get("reduced_decoding", False)),
            gpu_decode=bool(models.get("gpu_decode", False)),
            max_encoded_bytes=int(models["max_encoded_bytes"]),
            max_pixels=int(models["max_pixels"]),
        )


def model_names(source: Path = MODEL_REPOSITORY) -> list[str]:
    """The models of the source repository: folders with a config template."""
    return sorted(
        entry.name
        for entry in source.iterdir()
        if entry.is_dir() and not entry.name.startswith("_") and (entry / f"config.pbtxt{TEMPLATE_SUFFIX}").exists()
    )


def render_config(model: str, values: RenderValues, source: Path = MODEL_REPOSITORY) -> str:
    """The config.pbtxt of one model for these values."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(source)),
        undefined=jinja2.StrictUndefined,  # a missing value is an error, not an empty string
        keep_trailing_newline=True,
    )
    return environment.get_template(f"{model}/config.pbtxt{TEMPLATE_SUFFIX}").render(values.context())


def render(destination: Path, values: RenderValues, source: Path = MODEL_REPOSITORY) -> list[str]:
    """Write the servable repository to `destination` (replaced whole); return the model names."""
    destination = Path(destination)
    staging = destination.with_name(destination.name + ".rendering")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    names = model_names(source)
    for model in names:
        shutil.copytree(
            source / model,
            staging / model,
            symlinks=False,  # the variants' links to food_classifier/1 become files
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", f"*{TEMPLATE_SUFFIX}"),
        )
        (staging / model / "config.pbtxt").write_text(render_config(model, values, source), encoding="utf-8")
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    render_parser = commands.add_parser("render", help="render the repository into DEST")
    render_parser.add_argument("destination", type=Path)
    render_parser.add_argument("--gpus", type=int, required=True, help="GPU count of the serving host")
    render_parser.add_argument("--food11-weights", required=True, help="path of food11.pth on the serving host")
    render_parser.add_argument("--blip-source", required=True, help="BLIP hub id or folder on the serving host")
    render_parser.add_argument("--settings-json", help="the `lab.models` settings as JSON (default: fabric.yaml's)")
    smoke = render_parser.add_mutually_exclusive_group()
    smoke.add_argument("--smoke-weights", dest="smoke", action="store_const", const=True, help="label as smoke weights")
    smoke.add_argument("--real-weights", dest="smoke", action="store_const", const=False, help="label as real weights")
    args = parser.parse_args(argv)
    settings = lab_settings()
    if args.settings_json:
        settings["models"].update(json.loads(args.settings_json))
    values = RenderValues.from_settings(args.gpus, args.food11_weights, args.blip_source, settings, smoke=args.smoke)
    for name in render(args.destination, values):
        print(f"rendered {args.destination / name / 'config.pbtxt'}")


if __name__ == "__main__":
    main()
