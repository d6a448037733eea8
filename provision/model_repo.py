"""Render model_repository/ into the repository one host serves.

The source tree keeps one copy of everything: the classifier variants link to
food_classifier/1/*.py, and every config is a jinja2 template
(config.pbtxt.j2) whose host-dependent parts (GPU instance groups, weight
paths) are filled in here. A model's serving settings (instances, batch
sizes, queue delay, GPUs) are declared once, with their defaults, by the
`tuning(...)` call at the top of its template; `lab.models.tuned.<model>`
(fab tune's winner, `fab deploy --models-from`, or your own) overrides them. The rendered tree has plain files only, so it can
be copied anywhere (a container volume, a remote host).

    python -m provision.model_repo render DEST --gpus 0 --food11-weights W --blip-source B
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jinja2

from provision.config import MODEL_REPOSITORY
from provision.config import settings as lab_settings
from provision.errors import UsageError
from provision.smoke_weights import is_smoke

TEMPLATE_SUFFIX = ".j2"


class TuningError(UsageError):
    """A model's tuned settings do not fit its template or the host; the message says which setting."""


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
    # tests/test_preprocessing.py). Off unless asked: the lab defaults turn it on.
    reduced_decoding: bool = False
    # GPU instances: decode JPEGs with nvJPEG (torchvision.io.decode_jpeg on CUDA).
    gpu_decode: bool = False
    max_encoded_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    # None: detect from the weights' SMOKE_WEIGHTS markers. Set it when the
    # paths are those of another host, where this machine cannot look.
    smoke: bool | None = None
    # model -> the settings its template's tuning(...) takes, overriding their defaults.
    tuned: dict = field(default_factory=dict)

    @property
    def smoke_weights(self) -> bool:
        if self.smoke is not None:
            return self.smoke
        return is_smoke(self.food11_weights_path) or is_smoke(self.blip_source)

    def context(self) -> dict:
        return {**asdict(self), "smoke_weights": self.smoke_weights}

    def tuning(self, model: str, **defaults) -> dict:
        """What a template's tuning(...) returns: its defaults, overridden by lab.models.tuned.<model>."""
        chosen = dict(self.tuned.get(model) or {})
        where = f"lab.models.tuned.{model}"
        unknown = sorted(set(chosen) - set(defaults))
        if unknown:
            raise TuningError(f"{where}: {model} takes {', '.join(defaults)}; not {', '.join(unknown)}")
        settings = {**defaults, **chosen}
        for name, least in {"instance_count": 1, "max_batch_size": 1, "max_queue_delay_us": 0}.items():
            value = settings.get(name, least)
            if not isinstance(value, int) or value < least:
                raise TuningError(f"{where}.{name} is {value!r}: expected a whole number >= {least}")
        preferred = settings.get("preferred_batch_size", [])
        if any(not isinstance(size, int) or not 1 <= size <= settings["max_batch_size"] for size in preferred):
            raise TuningError(
                f"{where}.preferred_batch_size is {preferred!r}: each size must be 1..max_batch_size ({settings['max_batch_size']})"
            )
        if "gpus" in chosen and self.gpu_count > 0 and not 1 <= chosen["gpus"] <= self.gpu_count:
            raise TuningError(f"{where}.gpus is {chosen['gpus']!r}: this host has {self.gpu_count} GPU(s)")
        if self.gpu_count == 0 and "gpus" in settings:
            settings["gpus"] = 0  # no GPU on this host: the template renders CPU instances
        return settings

    @classmethod
    def from_settings(
        cls,
        gpu_count: int,
        food11_weights_path: str,
        blip_source: str,
        settings: dict | None = None,
        smoke: bool | None = None,
    ):
        """Values from the `lab` settings (provision/defaults.yaml and its overrides)."""
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
            tuned=dict(models.get("tuned") or {}),
        )


def model_names(source: Path = MODEL_REPOSITORY) -> list[str]:
    """The models of the source repository: folders with a config template."""
    return sorted(
        entry.name
        for entry in source.iterdir()
        if entry.is_dir() and not entry.name.startswith("_") and (entry / f"config.pbtxt{TEMPLATE_SUFFIX}").exists()
    )


# The models whose inputs are more than the one image that perf_analyzer's input file holds: fab bench and
# fab tune do not offer them, and say why and what to measure instead.
NOT_BENCHMARKED = {
    "conditional_captioning": "it takes a FOOD_LABEL beside its image, which the bench does not send; "
    "--model ensemble measures it, captioning each image conditioned on its predicted label",
}


def benchmarked_models(source: Path = MODEL_REPOSITORY) -> list[str]:
    """The models fab bench and fab tune measure: those whose one input is the image."""
    return [name for name in model_names(source) if name not in NOT_BENCHMARKED]


def _render(model: str, values: RenderValues, source: Path, seen: list[dict]) -> str:
    """Render one model's template; the settings its tuning(...) call returned are appended to `seen`."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(source)),
        undefined=jinja2.StrictUndefined,  # a missing value is an error, not an empty string
        keep_trailing_newline=True,
    )

    def tuning(**defaults) -> dict:
        seen.append(values.tuning(model, **defaults))
        return seen[-1]

    return environment.get_template(f"{model}/config.pbtxt{TEMPLATE_SUFFIX}").render(
        values.context() | {"tuning": tuning}
    )


def render_config(model: str, values: RenderValues, source: Path = MODEL_REPOSITORY) -> str:
    """The config.pbtxt of one model for these values."""
    return _render(model, values, source, [])


def tunable_settings(model: str, values: RenderValues, source: Path = MODEL_REPOSITORY) -> dict | None:
    """The settings a model's template takes (with their values for `values`), or None: it takes none."""
    seen: list[dict] = []
    _render(model, values, source, seen)
    return seen[0] if seen else None


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


def gpu_variants() -> list[str]:
    """The models whose template asks for GPU instances (they run on the CPU where a host has none)."""
    return sorted(
        template.parent.name
        for template in MODEL_REPOSITORY.glob("*/config.pbtxt.j2")
        if "gpu_instances.pbtxt.j2" in template.read_text()
    )


def read_tuned(path: str | Path) -> dict[str, dict]:
    """A tune's best.json (results/<run-id>/tune/best.json) -> {model: its settings}, for lab.models.tuned."""
    path = Path(path)
    try:
        best = json.loads(path.read_text())
        return {best["model"]: dict(best["settings"])}
    except FileNotFoundError:
        raise TuningError(f"{path}: no such file (fab tune writes results/<run-id>/tune/best.json)") from None
    except (ValueError, KeyError, TypeError) as error:
        raise TuningError(
            f'{path} is not a best.json of fab tune ({error!r}): it needs "model" and "settings"'
        ) from None


def check_tuned(settings: dict, source: Path = MODEL_REPOSITORY) -> None:
    """Raise TuningError, before anything is deployed, when lab.models.tuned names a model or a setting wrongly.

    The GPU count is the host's, known only when the repository is rendered
    there: it is checked then.
    """
    values = RenderValues.from_settings(0, "/weights/food11.pth", "blip", settings, smoke=False)
    names = model_names(source)
    for model in values.tuned:
        if model not in names:
            raise TuningError(f"lab.models.tuned names {model!r}: no such model (the models: {', '.join(names)})")
        if tunable_settings(model, values, source) is None:
            raise TuningError(f"lab.models.tuned names {model!r}: it has no serving settings to tune")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    render_parser = commands.add_parser("render", help="render the repository into DEST")
    render_parser.add_argument("destination", type=Path)
    render_parser.add_argument("--gpus", type=int, required=True, help="GPU count of the serving host")
    render_parser.add_argument("--food11-weights", required=True, help="path of food11.pth on the serving host")
    render_parser.add_argument("--blip-source", required=True, help="BLIP hub id or folder on the serving host")
    render_parser.add_argument("--settings-json", help="the `lab.models` settings as JSON (default: the merged lab settings)")
    smoke = render_parser.add_mutually_exclusive_group()
    smoke.add_argument("--smoke-weights", dest="smoke", action="store_const", const=True, help="label as smoke weights")
    smoke.add_argument("--real-weights", dest="smoke", action="store_const", const=False, help="label as real weights")
    args = parser.parse_args(argv)
    settings = lab_settings()
    if args.settings_json:
        settings["models"].update(json.loads(args.settings_json))
    values = RenderValues.from_settings(args.gpus, args.food11_weights, args.blip_source, settings, smoke=args.smoke)
    try:
        names = render(args.destination, values)
    except TuningError as error:
        parser.exit(2, f"error: {error}\n")
    for name in names:
        print(f"rendered {args.destination / name / 'config.pbtxt'}")


if __name__ == "__main__":
    main()
