"""Write perf_analyzer's --input-data JSON from image files.

python client_scripts/make_perf_input.py photo.jpg [more.jpg ...] -o input.json [--input-name INPUT_IMAGE]

The file is {"data": [{"INPUT_IMAGE": ["<base64 of photo.jpg>"]}, ...]}: one
entry per image, each a one-element BYTES tensor holding the base64 of the
file (the form the models' TYPE_STRING input takes). perf_analyzer cycles
through the entries. Standard library only, so it runs on any host.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path


def perf_input(images: list[Path], input_name: str = "INPUT_IMAGE") -> dict:
    """The --input-data document for these image files."""
    return {"data": [{input_name: [base64.b64encode(path.read_bytes()).decode("ascii")]} for path in images]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (JPEG, PNG, ...)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--input-name", default="INPUT_IMAGE", help="the model's input tensor (default %(default)s)")
    args = parser.parse_args(argv)
    empty = [str(path) for path in args.images if path.is_file() and path.stat().st_size == 0]
    if empty:
        print(f"error: empty file(s): {', '.join(empty)}", file=sys.stderr)
        return 1
    try:
        document = perf_input(args.images, args.input_name)
        args.output.write_text(json.dumps(document))
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.output}: {len(document['data'])} image(s) for input {args.input_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
