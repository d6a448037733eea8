"""Write perf_analyzer's --input-data JSON from image files.

python client_scripts/make_perf_input.py photo.jpg [more.jpg ...] -o input.json
    [--encoding raw|base64] [--input-name INPUT_IMAGE]

One entry per image, each a one-element BYTES tensor holding the image file;
perf_analyzer cycles through the entries. The models take either form:

  raw (default)  the file's bytes, as the seed's clients send them. JSON holds
                 no binary, so perf_analyzer's {"b64": ...} form carries it:
                 for a BYTES tensor perf_analyzer decodes that base64 and sends
                 the result as the tensor's serialized data, which for BYTES
                 is each element's 4-byte little-endian length, then its bytes.
                 So the b64 holds length + file (checked on the wire: without
                 the length, Triton reads the JPEG's first 4 bytes as one).
  base64         the file's base64 as a JSON string, the course's input.json:
                 sent as that text, which the models decode.

Standard library only, so it runs on any host.
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import sys
from pathlib import Path

ENCODINGS = ("raw", "base64")


def tensor_value(image: bytes, encoding: str = "raw") -> list | dict:
    """One image file as the JSON value of a one-element BYTES input."""
    if encoding == "raw":
        serialized = struct.pack("<I", len(image)) + image
        return {"b64": base64.b64encode(serialized).decode("ascii")}
    if encoding == "base64":
        return [base64.b64encode(image).decode("ascii")]
    raise ValueError(f"unknown encoding {encoding!r}: expected one of {', '.join(ENCODINGS)}")


def perf_input(images: list[bytes], input_name: str = "INPUT_IMAGE", encoding: str = "raw") -> dict:
    """The --input-data document for these image files' contents."""
    return {"data": [{input_name: tensor_value(image, encoding)} for image in images]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (JPEG, PNG, ...)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--input-name", default="INPUT_IMAGE", help="the model's input tensor (default %(default)s)")
    parser.add_argument(
        "--encoding", choices=ENCODINGS, default="raw", help="send the file's bytes or its base64 (default %(default)s)"
    )
    args = parser.parse_args(argv)
    empty = [str(path) for path in args.images if path.is_file() and path.stat().st_size == 0]
    if empty:
        print(f"error: empty file(s): {', '.join(empty)}", file=sys.stderr)
        return 1
    try:
        document = perf_input([path.read_bytes() for path in args.images], args.input_name, args.encoding)
        args.output.write_text(json.dumps(document))
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.output}: {len(document['data'])} image(s) for input {args.input_name}, as {args.encoding}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
