"""The Chinese hand-in's page, rendered by headless Chromium (`make test-browser`; needs Debian's `chromium` and a
font with Chinese glyphs, e.g. `fonts-wqy-microhei`): every figure loads, and neither the page's text nor the figures'
text is drawn as boxes.

A character no installed font has is drawn as the font's "missing glyph" box, the same picture for every such
character: a probe script draws each character of the page on a canvas (with the page's fonts and fallbacks) and
compares it with that box, drawn for two unassigned code points. The figures are PNGs: their text is the one in each
PNG's metadata, checked against the font matplotlib drew it with.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
import subprocess
from pathlib import Path

import pytest
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font
from PIL import Image

from pipeline.common.browser import CHROMIUM, NO_CHROMIUM
from pipeline.report.catalogue import load_catalogue
from pipeline.report.handin_figures import figure_font
from tests.helpers.projects import run_report_stage

pytestmark = pytest.mark.browser

PROBE = """<script>
function drawn(character) {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 48;
  const context = canvas.getContext("2d");
  context.font = "32px " + getComputedStyle(document.body).fontFamily;
  context.fillText(character, 4, 36);
  return canvas.toDataURL();
}
const box = [drawn("\\u0378"), drawn("\\u0379")];  // unassigned: no font has them
const characters = [...new Set(document.body.innerText)].filter((c) => c.codePointAt(0) >= 0x2e80);
const images = [...document.images].map((image) => [image.alt, image.complete && image.naturalWidth > 0]);
document.body.setAttribute("data-probe", JSON.stringify({
  boxSame: box[0] === box[1],
  characters: characters.join(""),
  boxes: characters.filter((c) => box.includes(drawn(c))).join(""),
  images: images,
}));
</script>"""


def _render(page: Path) -> tuple[dict[str, object], str]:
    assert CHROMIUM is not None
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom"]
    dom = subprocess.run([*flags, page.as_uri()], capture_output=True, text=True, timeout=180, check=True).stdout
    match = re.search(r'data-probe="([^"]*)"', dom)
    assert match, dom[-2000:]
    return json.loads(html.unescape(match.group(1))), dom


def test_the_chinese_handin_page_shows_its_figures_and_no_box_glyphs(tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    project = tmp_path / "project"
    project.mkdir()
    run_report_stage(project, "handin-page")
    page = project / "report" / "handin.zh.html"
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    found, dom = _render(probe)
    assert found["boxSame"]  # the probe's notion of a box holds on this Chromium
    assert len(str(found["characters"])) > 100  # the page's Chinese text, as Chromium laid it out
    assert found["boxes"] == "", (
        f"Chromium draws {found['boxes']!r} as boxes: install a font with Chinese glyphs (Debian: fonts-wqy-microhei)"
    )
    assert [alt for alt, _ in found["images"]] == [
        "神经网络数据流图",
        "损失和正确率趋势图",
        "网络分析，使用率前十名的操作",
    ]
    assert all(shown for _, shown in found["images"]), found["images"]
    # The figures carry the hand-in's words in the font that draws them (where one is installed), else no words.
    fonts = [font_manager.findfont(font_manager.FontProperties())]
    family = figure_font(load_catalogue("zh"))
    if family is not None:
        fonts.append(font_manager.findfont(font_manager.FontProperties(family=family)))
    covered = set().union(*(FT2Font(font).get_charmap() for font in fonts))
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', dom):
        with Image.open(io.BytesIO(base64.b64decode(data))) as figure:
            text = figure.text["Description"]
        assert text and all(ord(ch) in covered for ch in text if not ch.isspace()), text
