"""Content digests of the staged folders, compared with what the host has, so a deploy copies only what changed.

Ansible's copy of a folder checks every file on the host, one module call each
(most of a no-change re-deploy's time). The roles digest each staged folder on
the controller, compare with the digests the host recorded after its last
successful deploy (run/synced.json), and copy a folder only when it differs.

A folder named with "/*" (models/*=...) is digested per subfolder: a changed
model config is then one model to copy and to load into the running server
(explicit model control), not a restart of Triton.

    python -m provision.tree_digest --synced-json '{"lib": "..."}' lib=bundle/lib 'models/*=bundle/models-HOST'

prints {"digests": {"lib": "...", "models": {"name": "..."}},
        "differ": ["models"], "members": {"models": {"differ": [...], "removed": [...]}}}

With --pack ARCHIVE it also writes what differs into one tar (lib/..., models/NAME/...):
the roles send that one file and unarchive each part, instead of Ansible's
copy of a folder, which costs two module calls per file (seconds per folder
here, a round trip per file over SSH to a cloud node).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
from pathlib import Path


def tree_digest(folder: Path) -> str:
    """sha256 over every file's relative path, mode bits and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder)}\0{path.stat().st_mode & 0o111:o}\0".encode())
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def member_digests(folder: Path) -> dict[str, str]:
    """{subfolder name: digest}, for a folder of independent parts (a model repository)."""
    return {child.name: tree_digest(child) for child in sorted(folder.iterdir()) if child.is_dir()}


def compare(folders: dict[str, Path], synced: dict) -> dict:
    """The staged digests, which folders differ from `synced`, and, per "/*" folder, which members."""
    digests: dict[str, str | dict[str, str]] = {}
    members = {}
    for name, folder in folders.items():
        if name.endswith("/*"):
            name = name[:-2]
            digests[name] = staged = member_digests(folder)
            # A record from before per-member digests (a plain string) knows no member.
            before = synced.get(name) if isinstance(synced.get(name), dict) else {}
            members[name] = {
                "differ": [member for member, digest in staged.items() if before.get(member) != digest],
                "removed": sorted(set(before) - set(staged)),
            }
        else:
            digests[name] = tree_digest(folder)
    differ = [name for name, digest in digests.items() if synced.get(name) != digest]
    return {"digests": digests, "differ": differ, "members": members}


def pack(archive: Path, folders: dict[str, Path], compared: dict) -> bool:
    """Write the folders (and "/*" members) that differ into `archive`; False (and no file) if none does.

    Files get mode 0644 and folders 0755, as the roles' copies gave them.
    """
    parts = [(name, folder) for name, folder in folders.items() if not name.endswith("/*") and name in compared["differ"]]
    for name, folder in folders.items():
        if name.endswith("/*"):
            base = name[:-2]
            parts += [(f"{base}/{member}", folder / member) for member in compared["members"][base]["differ"]]
    archive.unlink(missing_ok=True)
    if not parts:
        return False

    def normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mode = 0o755 if info.isdir() else 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w") as tar:
        for arcname, folder in parts:
            tar.add(folder, arcname=arcname, filter=normalised)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synced-json", default="{}", help="what the host recorded (run/synced.json); {} for none")
    parser.add_argument("--pack", type=Path, metavar="ARCHIVE", help="also write what differs into this tar")
    parser.add_argument("folders", nargs="+", metavar="NAME=PATH", help="NAME/*=PATH digests each subfolder")
    args = parser.parse_args(argv)
    folders = {name: Path(path) for name, path in (folder.split("=", 1) for folder in args.folders)}
    compared = compare(folders, json.loads(args.synced_json))
    if args.pack:
        compared["archive"] = str(args.pack) if pack(args.pack, folders, compared) else None
    print(json.dumps(compared))
    return 0


if __name__ == "__main__":
    sys.exit(main())
