"""The lab guide's pages (docs/lab-guide.md) still show what the guide says they show: every shot of
`make screenshots` (tests/helpers/guide.py) taken on a freshly reproduced project, in headless Chromium against a
real `mlflow server` and `tensorboard`. A page that lacks a text the guide promises fails here before a retaken
picture could show it."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.browser import CHROMIUM, NO_CHROMIUM
from tests.helpers.guide import SHOTS, retake

pytestmark = pytest.mark.browser


def test_every_page_of_the_lab_guide_shows_what_the_guide_says(reproduced_project: Path, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    pictures = tmp_path / "images"
    pictures.mkdir()
    missing = retake(reproduced_project, pictures, tmp_path / "scratch")
    assert missing == {shot.name: [] for shot in SHOTS}
    for shot in SHOTS:
        with Image.open(pictures / f"{shot.name}.png") as picture:
            assert picture.width == 1400 and len(set(picture.getdata())) > 50  # a page, not a blank screen
