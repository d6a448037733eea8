"""`make demo`: the whole job on the local target, as a user runs it.

fab provision --target local -> fab deploy -> a classification through Triton
-> fab bench --quick -> fab teardown (always, even after a failure), then
says where the report is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision import config, sample_images

FAB = str(Path(sys.executable).parent / "fab")


def fab(*args: str) -> str:
    print(f"\n$ fab {' '.join(args)}", flush=True)
    done = subprocess.run([FAB, *args], cwd=config.PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"demo stopped: `fab {' '.join(args)}` failed")
    return done.stdout


def main() -> int:
    settings = config.settings()
    report = None
    try:
        fab("provision", "--target", "local")
        fab("deploy")
        fab("status")
        photo = config.runtime_dir(settings) / "demo.jpg"
        photo.write_bytes(sample_images.jpeg())
        print(f"\n$ python client_scripts/classify.py {photo}", flush=True)
        subprocess.run(
            [sys.executable, str(config.PROJECT_ROOT / "client_scripts" / "classify.py"), str(photo),
             "--url", f"127.0.0.1:{settings['ports']['triton_http']}"],
            check=False,
        )  # fmt: skip
        output = fab("bench", "--quick")
        report = next((line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("report: ")), None)
    finally:
        fab("teardown")
    print(f"\nThe report of this run: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
