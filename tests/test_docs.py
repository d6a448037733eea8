"""The front page stays a front page, every link of the docs leads somewhere, and the package that
`pip install .` builds holds every module of the tree, and each of them imports once installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

from provision.config import PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_a_front_page_of_200_lines_at_most():
    assert len((PROJECT_ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a web address, or a heading of the same page
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(PROJECT_ROOT)}: {target}")
    assert broken == []


def test_the_docs_cite_no_file_outside_the_repository():
    for page in PAGES:
        assert "../shared" not in page.read_text() and "REFERENCE.md" not in page.read_text(), page


IMPORT_EVERY_MODULE = """
import importlib, pkgutil, provision
for found in pkgutil.walk_packages(provision.__path__, "provision."):
    importlib.import_module(found.name)
print(provision.__file__)
"""


def test_the_wheel_holds_every_module_of_the_package(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools builds in the source tree
    shutil.copytree(PROJECT_ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".runtime", ".state", "results", ".git", "__pycache__", "*.egg-info", "build", "tests", "benchmarks",
    ))  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(tmp_path),
         str(source)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    held = set(zipfile.ZipFile(wheel).namelist())
    # Installed from the wheel (its dependencies are this environment's), every module imports.
    installed = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(installed), str(wheel)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    imported = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE], env={**os.environ, "PYTHONPATH": str(installed)},
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(installed)), "the installed copy, not the checkout"
    tree = {
        str(path.relative_to(PROJECT_ROOT))
        for path in (PROJECT_ROOT / "provision").rglob("*")
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts
    }
    assert tree - held == set(), "left out of the wheel"

