"""Reading the lab report back by section: each found by its title, whatever number the renderer gave it."""

from __future__ import annotations

import re

from pipeline.report.lab_report import SECTIONS


def report_section(markdown: str, key: str) -> str:
    """The body of the report's section `key` (pipeline.report.lab_report.SECTIONS): what stands between its
    heading "## N. Title" and the next heading of its level; the test fails where the section is not there."""
    title = next(section.title for section in SECTIONS if section.key == key)
    found = re.search(rf"^## \d+\. {re.escape(title)}\n\n(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    assert found, f"the report has no section {title!r}"
    return found[1]
