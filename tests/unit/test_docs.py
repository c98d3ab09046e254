"""The reference a user reads stays in step with the code: every option is documented, and
every relative link in the README and docs/ points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

from lakesink_datasource.options import MAINTENANCE_MODES, OPTION_NAMES
from lakesink_datasource.read.options import _READ

ROOT = Path(__file__).resolve().parents[2]


def test_every_write_and_read_option_is_in_the_options_reference() -> None:
    reference = (ROOT / "docs" / "options.md").read_text()
    missing = sorted(name for name in OPTION_NAMES | _READ if f"`{name}`" not in reference)
    assert not missing, f"docs/options.md does not document: {missing}"
    assert all(f"`{mode}`" in reference for mode in MAINTENANCE_MODES)


def test_relative_links_in_the_readme_and_docs_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
