"""Classify image files with a Food-11 classifier served by Triton, directly or through the API.

python client_scripts/classify.py photo.jpg [more.jpg ...] [--model batching_food_classifier]
python client_scripts/classify.py photo.jpg --api http://127.0.0.1:8080   # through the FastAPI service

Prints one line per file: `photo.jpg: Soup (0.958)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException


class ApiError(RuntimeError):
    """The API answered with an error; the message is its `detail`."""


def deployed_triton(default: str = "localhost:8000") -> str:
    """Where this checkout's deployment answers: 127.0.0.1 and the Triton HTTP port `fab deploy` recorded
    (on this machine, or forwarded by `fab tunnel`); `default` where nothing is deployed from here
    (on a host, in a container). Read from the state file (LAB_STATE_FILE, else .state/state.json)."""
    state_file = Path(os.environ.get("LAB_STATE_FILE") or Path(__file__).resolve().parent.parent / ".state" / "state.json")
    try:
        ports = json.loads(state_file.read_text())["deploy"]["ports"]
        return f"127.0.0.1:{int(ports['triton_http'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return default


def classify_files(url: str, model: str, paths: list[Path]) -> list[tuple[str, float]]:
    """One request per file, to Triton at url (host:port); returns [(label, probability)]."""
    answers = []
    with triton_http.InferenceServerClient(url) as client:
        for path in paths:
            # The file's bytes, as the seed's client sends them (the models take base64 too).
            items = np.array([[path.read_bytes()]], dtype=np.object_)
            image_input = triton_http.InferInput("INPUT_IMAGE", list(items.shape), "BYTES")
            image_input.set_data_from_numpy(items)
            result = client.infer(model, [image_input])
            answers.append((result.as_numpy("FOOD_LABEL")[0, 0].decode(), float(result.as_numpy("PROBABILITY")[0, 0])))
    return answers


def post_image(api_url: str, endpoint: str, path: Path, params: dict | None = None, timeout_s: float = 120) -> dict:
    """POST one image file to the API as multipart `file`; the JSON answer, or ApiError.

    Standard library only, so the script needs nothing beyond tritonclient.
    """
    boundary = uuid.uuid4().hex
    body = b"".join(
        [
            f"--{boundary}\r\n".encode(),
            f'Content-Disposition: form-data; name="file"; filename="{path.name}"\r\n'.encode(),
            b"Content-Type: application/octet-stream\r\n\r\n",
            path.read_bytes(),
            f"\r\n--{boundary}--\r\n".encode(),
        ]
    )
    url = f"{api_url.rstrip('/')}/{endpoint}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:  # the API's own answer: {"detail": ...}
        text = error.read().decode("utf-8", "replace")
        try:
            detail = json.loads(text).get("detail", text)
        except ValueError:
            detail = text[:500]
        raise ApiError(f"HTTP {error.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as error:
        raise ApiError(f"cannot reach the API at {api_url}: {getattr(error, 'reason', error)}") from None


def classify_files_via_api(api_url: str, model: str | None, paths: list[Path]) -> list[tuple[str, float]]:
    """The same through the API's POST /classify (model None: the API's default variant)."""
    answers = []
    for path in paths:
        body = post_image(api_url, "classify", path, params={"model": model} if model else None)
        answers.append((body["label"], float(body["probability"])))
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (JPEG, PNG, ...)")
    parser.add_argument(
        "--url", default=deployed_triton(), help="Triton HTTP endpoint, host:port (default: the deployed one, %(default)s)"
    )
    parser.add_argument("--api", metavar="URL", help="go through the FastAPI service at URL instead of Triton")
    parser.add_argument(
        "--model", help="classifier variant (default batching_food_classifier; with --api, the API's default)"
    )
    args = parser.parse_args(argv)
    try:
        if args.api:
            answers = classify_files_via_api(args.api, args.model, args.images)
        else:
            answers = classify_files(args.url, args.model or "batching_food_classifier", args.images)
        for path, (label, probability) in zip(args.images, answers):
            print(f"{path}: {label} ({probability:.3f})")
    except InferenceServerException as error:
        print(f"error: {error.message()}", file=sys.stderr)
        return 1
    except (ApiError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
