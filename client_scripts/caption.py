"""Caption image files with the ensemble (classifier -> label-conditioned BLIP), directly or through the API.

python client_scripts/caption.py photo.jpg [more.jpg ...] [--url HOST:PORT] [--model ensemble]
python client_scripts/caption.py photo.jpg --api http://127.0.0.1:8080   # through the FastAPI service

Prints one line per file: `photo.jpg: [Soup 0.958] a photo of soup, ...`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http
from classify import ApiError, deployed_triton, post_image  # noqa: I001 (a sibling script: client_scripts/ is on sys.path)
from tritonclient.utils import InferenceServerException

OUTPUTS = ("OUTPUT", "FOOD_LABEL", "PROBABILITY")  # the caption and the label it was conditioned on


def caption_files(url: str, model: str, paths: list[Path]) -> list[tuple[str, str, float]]:
    """One request per file to Triton at url (host:port); returns [(caption, label, probability)]."""
    answers = []
    with triton_http.InferenceServerClient(url) as client:
        for path in paths:
            # The file's bytes, as the seed's client sends them (the models take base64 too).
            items = np.array([[path.read_bytes()]], dtype=np.object_)
            image_input = triton_http.InferInput("INPUT_IMAGE", list(items.shape), "BYTES")
            image_input.set_data_from_numpy(items)
            outputs = [triton_http.InferRequestedOutput(name) for name in OUTPUTS]
            result = client.infer(model, [image_input], outputs=outputs)
            answers.append(
                (
                    result.as_numpy("OUTPUT")[0, 0].decode(),
                    result.as_numpy("FOOD_LABEL")[0, 0].decode(),
                    float(result.as_numpy("PROBABILITY")[0, 0]),
                )
            )
    return answers


def caption_files_via_api(api_url: str, paths: list[Path]) -> list[tuple[str, str, float]]:
    """The same through the API's POST /caption (the API decides the model)."""
    answers = []
    for path in paths:
        body = post_image(api_url, "caption", path)
        answers.append((body["caption"], body["label"], float(body["probability"])))
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (JPEG, PNG, ...)")
    parser.add_argument(
        "--url", default=deployed_triton(), help="Triton HTTP endpoint, host:port (default: the deployed one, %(default)s)"
    )
    parser.add_argument("--api", metavar="URL", help="go through the FastAPI service at URL instead of Triton")
    parser.add_argument("--model", default="ensemble", help="the captioning model on Triton (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.api:
            answers = caption_files_via_api(args.api, args.images)
        else:
            answers = caption_files(args.url, args.model, args.images)
        for path, (caption, label, probability) in zip(args.images, answers):
            print(f"{path}: [{label} {probability:.3f}] {caption}")
    except InferenceServerException as error:
        print(f"error: {error.message()}", file=sys.stderr)
        return 1
    except (ApiError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
