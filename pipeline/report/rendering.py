"""The report's markdown rendered for each place it is read: a self-contained HTML page, TensorBoard's
Text tab and MLflow's artifact preview.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath

GRAPH_FIGURE = "figures/model_graph.svg"  # the dataflow graph, copied beside the report


def embed_images(html: str, folder: Path) -> str:
    """Replace `src="figures/x.png"` with data URIs so the HTML file stands alone."""

    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(1)
        if not path.exists():
            return match.group(0)
        kind = "image/svg+xml" if path.suffix == ".svg" else "image/png"
        return f'src="data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    return re.sub(r'src="([^"]+)"', inline, html)


HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="{language}"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, "Noto Sans CJK SC", "WenQuanYi Micro Hei", "Microsoft YaHei", "PingFang SC",
  sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; }}
th {{ background: #f3f3f3; }}
code {{ background: #f6f6f6; padding: 0 0.2em; }}
img {{ max-width: 100%; }}
</style></head><body>
{body}
</body></html>
"""


def markdown_to_html(markdown_text: str, title: str, folder: Path, language: str = "en") -> str:
    """A self-contained page (figures inlined); `language` is its `lang` (BCP 47), which picks the fonts a browser
    draws its text with (zh-CN: Simplified Chinese glyphs)."""
    import markdown  # lazy: only the HTML page needs it

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code"])
    return embed_images(HTML_TEMPLATE.format(title=title, body=body, language=language), folder)


# --- the report as the tracking tools show it ------------------------------------------------------------
#
# report/report.md keeps relative `figures/*.png` images: they resolve on the forge and in an editor beside
# the folder. Neither tool resolves them, and neither shows an image written as a data: URI:
# - TensorBoard's Text tab sanitizes markdown with http, https and mailto links only: a data: image comes out
#   broken, and `figures/x.png` resolves against TensorBoard's own address (404). Its Images tab shows PNGs.
# - MLflow's preview of a .md file prints an image without a scheme as the text `[alt](src)` and empties a
#   data: src. Its .html preview shows report.html with its inlined figures.
# Only an absolute http(s) image URL would show in both, and the stage cannot know where either is served
# (tests/browser checks both tools). So each tool gets a variant whose images are replaced by a line saying
# where the figure is shown.
FIGURE_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<path>figures/[^)\s]+)\)")
TENSORBOARD_IMAGE_PREFIX = "report/"


def tensorboard_image_tag(path: str) -> str | None:
    """The Images-tab tag of a report figure (`report/<name>`); None for a non-PNG (the SVG graph), which the
    Images tab cannot show."""
    figure = PurePosixPath(path)
    return f"{TENSORBOARD_IMAGE_PREFIX}{figure.stem}" if figure.suffix == ".png" else None


def with_figures_named(markdown_text: str, note: str, figure_line: Callable[[str, str], str]) -> str:
    """`markdown_text` with every figure image replaced by `figure_line(alt, path)` and `note` under the title."""
    replaced = FIGURE_IMAGE.sub(lambda match: figure_line(match.group("alt"), match.group("path")), markdown_text)
    title, _, rest = replaced.partition("\n")
    return f"{title}\n\n{note}\n{rest}"


def markdown_for_tensorboard(markdown_text: str) -> str:
    """The report for TensorBoard's Text tab: each PNG figure named by its Images-tab tag (the stage logs it
    there with `tensorboard_image_tag`), the SVG graph by where it is shown; no image left to break."""

    def figure_line(alt: str, path: str) -> str:
        tag = tensorboard_image_tag(path)
        if tag is not None:
            return f"**Figure: {alt}**: TensorBoard's Images tab, tag `{tag}`."
        where = "the Graphs tab (export_graph run) shows the graph; " if path == GRAPH_FIGURE else ""
        return f"**Figure: {alt}**: {where}`{path}` is an MLflow artifact of this run and inline in `report.html`."

    note = (
        f"_Figures: TensorBoard's Images tab, tags `{TENSORBOARD_IMAGE_PREFIX}...`; "
        "`report/report.html` and the MLflow run's `report.html` show the report with every figure inline._"
    )
    return with_figures_named(markdown_text, note, figure_line)


def markdown_for_mlflow(markdown_text: str) -> str:
    """The report.md logged to MLflow: each figure named by its artifact path (the stage logs the figures under
    `figures/`), since MLflow's markdown preview shows no relative or data: image."""

    def figure_line(alt: str, path: str) -> str:
        return f"**Figure: {alt}**: artifact `{path}` of this run (open it in the artifact tree)."

    note = (
        "_Figures: this run's `figures/` artifacts; `report.html` beside this file shows the report with every "
        "figure inline._"
    )
    return with_figures_named(markdown_text, note, figure_line)
