"""The environment `make install` builds is exactly requirements.txt, whichever installer (uv or pip) ran; the
README and docs/ link only to what exists."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.guide import SHOTS
from tests.helpers.repo import REPO_ROOT

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(requirements: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _PIN.match(line.strip())
        assert match, f"requirements.txt: {line!r} is not a `name==version` pin"
        pins[_canonical(match.group(1))] = match.group(2)
    return pins


def test_the_installed_environment_is_exactly_the_pinned_requirements() -> None:
    pins = _pins(REPO_ROOT / "requirements.txt")
    assert "uv" in pins and "torch" in pins  # the installer itself is pinned like everything else
    installed = {
        _canonical(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=[p for p in sys.path if p.endswith("site-packages")])
    }
    installed.pop("pip", None)  # Makefile pins pip apart (PIP_VERSION): it installs the installer
    wrong = {name: (version, installed.get(name)) for name, version in pins.items() if installed.get(name) != version}
    extra = sorted(set(installed) - set(pins))
    assert not wrong, f"installed versions differ from requirements.txt (pinned, installed): {wrong}"
    assert not extra, f"installed but not pinned in requirements.txt: {extra}"


def test_make_targets_let_python_keep_the_bytecode_it_compiles() -> None:
    """uv installs no .pyc files; a target run with PYTHONDONTWRITEBYTECODE set would compile every import anew."""
    probe = "probe: ; @python -c 'import sys; print(sys.dont_write_bytecode)'"
    result = subprocess.run(
        ["make", "--no-print-directory", "-s", "--eval", probe, "probe"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_requirements_record_no_index_address() -> None:
    text = (REPO_ROOT / "requirements.txt").read_text()
    assert not re.search(r"https?://|--index-url|--extra-index-url|--find-links", text)


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target}")
    assert len(pages) >= 3 and not broken, broken


def test_the_guide_shows_every_shot_once_under_its_step() -> None:
    """docs/lab-guide.md embeds each picture `make screenshots` takes under the step it illustrates, and quotes what
    the page shows (tests/browser/test_lab_guide.py checks the pages do)."""
    guide = (REPO_ROOT / "docs" / "lab-guide.md").read_text()
    steps = re.split(r"^## ", guide, flags=re.MULTILINE)
    for shot in SHOTS:
        (step,) = [text for text in steps if text.startswith(f"{shot.step}.")]
        assert step.count(f"(images/{shot.name}.png)") == 1, shot.name
        assert all(said in step for said in shot.shows if said.isascii() and len(said) > 8), shot.name
