"""Classify image files with a Food-11 classifier served by Triton.

python client_scripts/classify.py photo.jpg [more.jpg ...] [--model batching_food_classifier]
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException


def classify_files(url: str, model: str, paths: list[Path]) -> list[tuple[str, float]]:
    """One request per file; returns [(label, probability)]."""
    answers = []
    with triton_http.InferenceServerClient(url) as client:
        for path in paths:
            items = np.array([[base64.b64encode(path.read_bytes())]], dtype=np.object_)
            image_input = triton_http.InferInput("INPUT_IMAGE", list(items.shape), "BYTES")
            image_input.set_data_from_numpy(items)
            result = client.infer(model, [image_input])
            answers.append((result.as_numpy("FOOD_LABEL")[0, 0].decode(), float(result.as_numpy("PROBABILITY")[0, 0])))
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (JPEG, PNG, ...)")
    parser.add_argument("--url", default="localhost:8000", help="Triton HTTP endpoint (default %(default)s)")
    parser.add_argument("--model", default="batching_food_classifier", help="classifier variant (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        for path, (label, probability) in zip(args.images, classify_files(args.url, args.model, args.images)):
            print(f"{path}: {label} ({probability:.3f})")
    except InferenceServerException as error:
        print(f"error: {error.message()}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
