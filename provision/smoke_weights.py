"""Smoke weights: the real architectures with random values, made without any download.

Where no model hub is reachable (CI, this project's test machines) the serving
stack still runs end to end on weights that have the real shapes:

  DIR/food11.pth     MobileNetV2 with 11 classes, saved whole with torch.save(model),
                     the format of the course's food11.pth
  DIR/blip-tiny/     a tiny BLIP (small vision and text towers, a locally written
                     vocabulary), saved with save_pretrained; loads like a hub folder
  SMOKE_WEIGHTS      marker files: the models log it and the bench report says it

Generation is seeded and skipped when the files exist, so a second run changes nothing.

    python -m provision.smoke_weights DIR [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from provision import config
from provision.errors import UsageError

# The models read the same name (serving_common.SMOKE_MARKER): they cannot import this package.
SMOKE_MARKER = "SMOKE_WEIGHTS"
FOOD11_FILE = "food11.pth"
BLIP_FOLDER = "blip-tiny"
SEED = 11

# Words the tiny tokenizer knows: the prompt, the labels, a few caption words.
_VOCAB_WORDS = """
a an the of on in with and photo picture plate bowl table some fresh hot
bread dairy product dessert egg fried food meat noodles pasta rice seafood soup vegetable fruit
, . / - ##s
""".split()
_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]


def is_smoke(path: str) -> bool:
    """Whether a weights file or folder carries the smoke-weights marker."""
    if not path or not os.path.exists(path):
        return False
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    return os.path.exists(os.path.join(folder, SMOKE_MARKER))


def weight_sources(settings: dict) -> tuple[str, str]:
    """(food11.pth path, BLIP source): the configured ones, else the smoke weights."""
    smoke_dir = config.runtime_dir(settings) / "weights"
    food11 = settings.get("food11_weights") or str(smoke_dir / FOOD11_FILE)
    blip = settings.get("blip_source") or str(smoke_dir / BLIP_FOLDER)
    if not settings.get("food11_weights") and not Path(food11).exists():
        raise UsageError(f"no Food-11 weights at {food11}: run `make weights` or set lab.food11_weights")
    return food11, blip


def _marker_text(what: str) -> str:
    return json.dumps({"smoke_weights": True, "what": what, "note": "random values: outputs are meaningless"}, indent=2)


def write_food11(path: Path) -> None:
    """A randomly initialised Food-11 MobileNetV2, pickled whole like the course's food11.pth."""
    import torch
    from torchvision import models

    torch.manual_seed(SEED)
    network = models.mobilenet_v2(weights=None, num_classes=11)
    # Fresh BatchNorm statistics make every image map to the same features, so
    # every image would get one label at probability ~1/11, and tests could not
    # tell images apart. Calibrate the statistics on smooth random images and
    # widen the head: labels and probabilities then vary from image to image.
    for module in network.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # cumulative average over the calibration batches
            module.reset_running_stats()
    generator = torch.Generator().manual_seed(SEED)
    network.train()
    with torch.no_grad():
        for _ in range(4):
            coarse = torch.randn(16, 3, 7, 7, generator=generator)
            images = torch.nn.functional.interpolate(coarse, size=224, mode="bilinear")
            network(images + 0.3 * torch.randn(16, 3, 224, 224, generator=generator))
    network.eval()
    torch.nn.init.normal_(network.classifier[1].weight, std=0.2, generator=generator)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    torch.save(network, temporary)
    temporary.rename(path)


def write_tiny_blip(folder: Path) -> None:
    """A BLIP captioning model small enough to generate in milliseconds on a CPU."""
    import torch
    from transformers import (
        BertTokenizerFast,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    vocab = _SPECIAL_TOKENS + _VOCAB_WORDS
    vocab_file = staging / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True, bos_token="[DEC]")

    image_size = 64
    config = BlipConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": 16,
        },
        text_config={
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 64,
            "encoder_hidden_size": 32,
            "pad_token_id": vocab.index("[PAD]"),
            "bos_token_id": vocab.index("[DEC]"),
            "sep_token_id": vocab.index("[SEP]"),
            "eos_token_id": vocab.index("[SEP]"),
        },
        projection_dim=32,
    )
    torch.manual_seed(SEED)
    model = BlipForConditionalGeneration(config).eval()
    image_processor = BlipImageProcessor(size={"height": image_size, "width": image_size})
    processor = BlipProcessor(image_processor=image_processor, tokenizer=tokenizer)
    model.save_pretrained(staging)
    processor.save_pretrained(staging)
    (staging / SMOKE_MARKER).write_text(_marker_text("tiny random BLIP"), encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def generate(directory: Path, force: bool = False) -> dict[str, Path]:
    """Write the smoke weights into `directory` (kept when present); return their paths."""
    directory = Path(directory)
    food11, blip = directory / FOOD11_FILE, directory / BLIP_FOLDER
    if force or not food11.exists():
        write_food11(food11)
    if force or not (blip / SMOKE_MARKER).exists():
        write_tiny_blip(blip)
    marker = directory / SMOKE_MARKER
    if not marker.exists():
        marker.write_text(_marker_text("MobileNetV2 Food-11, random"), encoding="utf-8")
    return {"food11_weights": food11, "blip_source": blip}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="where to write the weights")
    parser.add_argument("--force", action="store_true", help="regenerate even if present")
    args = parser.parse_args(argv)
    for name, path in generate(args.directory, args.force).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
