"""The front page stays a front page, and every link of the docs leads somewhere."""

from __future__ import annotations

import re

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
