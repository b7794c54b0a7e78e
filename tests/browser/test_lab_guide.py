"""The lab guide's pages (docs/lab-guide.md) still show what the guide says they show: `make screenshots`'s command
(tests/helpers/guide.py) run on a reproduced project of this tree (tests/browser/conftest.py), in headless Chromium
against a real `mlflow server` and `tensorboard`. A page that lacks a text the guide promises fails here before a
retaken picture could show it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from pipeline.common.browser import CHROMIUM, NO_CHROMIUM
from tests.helpers.guide import SHOTS
from tests.helpers.repo import REPO_ROOT

pytestmark = pytest.mark.browser


def test_every_page_of_the_lab_guide_shows_what_the_guide_says(reproduced_project: Path, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    pictures = tmp_path / "images"
    command = [sys.executable, "-m", "tests.helpers.guide", str(reproduced_project), "--into", str(pictures)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.splitlines() == [f"{pictures / shot.name}.png: retaken" for shot in SHOTS]
    for shot in SHOTS:
        with Image.open(pictures / f"{shot.name}.png") as picture:
            assert picture.width == 1400 and len(set(picture.get_flattened_data())) > 50  # a page, not a blank screen
