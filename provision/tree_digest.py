"""One content digest per staged folder, so that a deploy copies only the folders that changed.

Ansible's copy of a folder checks every file on the host, one module call each
(most of a no-change re-deploy's time). The roles compare these digests with
the ones recorded on the host by the last deploy (run/synced.json) and copy a
folder only when its digest differs; the copy itself is unchanged.

    python -m provision.tree_digest lib=bundle/lib models=bundle/models-HOST   # prints {"lib": "...", ...}
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def tree_digest(folder: Path) -> str:
    """sha256 over every file's relative path, mode bits and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder)}\0{path.stat().st_mode & 0o111:o}\0".encode())
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    pairs = [argument.split("=", 1) for argument in (sys.argv[1:] if argv is None else argv)]
    print(json.dumps({name: tree_digest(Path(path)) for name, path in pairs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
