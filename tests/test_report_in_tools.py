"""The report as TensorBoard and MLflow show it: the report stage run in process on a temp project, read back
through TensorBoard's EventAccumulator and sanitizer and through the MLflow client (real SQLite store)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow import MlflowClient
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugin_util import markdown_to_safe_html

from pipeline.report.lab_report import GRAPH_FIGURE
from pipeline.report.rendering import FIGURE_IMAGE, markdown_for_mlflow, markdown_for_tensorboard
from tests.helpers.projects import run_report_stage

RELATIVE_IMAGE = re.compile(r"!\[[^\]]*\]\(figures/")
EXPERIMENT = "report-in-tools"


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_report_stage(tmp_path_factory.mktemp("report-in-tools"), EXPERIMENT)


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_the_report_file_keeps_its_relative_figures_and_they_exist(reported: Path) -> None:
    """report/report.md reads on the forge and in an editor: relative images, each file beside it."""
    markdown = (reported / "report" / "report.md").read_text()
    paths = [match["path"] for match in FIGURE_IMAGE.finditer(markdown)]
    assert {"figures/training_curves.png", "figures/per_sample_time.png", GRAPH_FIGURE} <= set(paths)
    assert all((reported / "report" / path).is_file() for path in paths)


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_tensorboard_text_tab_shows_no_broken_image_and_names_each_figure_tag(reported: Path) -> None:
    (logdir,) = (reported / "runs" / "report").iterdir()
    events = EventAccumulator(str(logdir), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    (text_event,) = events.Tensors("report/markdown/text_summary")
    text = text_event.tensor_proto.string_val[0].decode()
    assert not RELATIVE_IMAGE.search(text)
    # What the Text tab inserts into the page: TensorBoard's own markdown + sanitizer.
    html = markdown_to_safe_html(text)
    assert "<img" not in html
    figures = sorted(path for path in (reported / "report" / "figures").glob("*.png") if "handin" not in path.name)
    assert len(figures) >= 4
    for figure in figures:
        tag = f"report/{figure.stem}"
        assert f"tag <code>{tag}</code>" in html, tag
        (image,) = events.Images(tag)
        assert image.encoded_image_string == figure.read_bytes()
        with Image.open(figure) as decoded:
            assert (image.width, image.height) == decoded.size
    assert "the Graphs tab (export_graph run) shows the graph" in html  # the SVG, which the Images tab cannot show
    assert set(events.Tags()["images"]) == {f"report/{figure.stem}" for figure in figures}


def test_tensorboard_sanitizer_drops_data_uris_so_figures_cannot_be_inlined() -> None:
    """Why the Text tab names Images-tab tags instead of inlining the figures: the sanitizer empties data: URIs."""
    html = markdown_to_safe_html("![curve](data:image/png;base64,iVBORw0KGgo=)")
    assert "data:" not in html and "<img" in html  # an image with no source: broken


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_mlflow_report_md_names_figure_artifacts_and_report_html_inlines_them(reported: Path) -> None:
    client = MlflowClient(f"sqlite:///{reported / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'report'")
    folder = Path(client.download_artifacts(run.info.run_id, "", str(reported / "downloaded")))
    markdown = (folder / "report.md").read_text()
    # MLflow's preview prints a scheme-less image as `[alt](src)` text and empties data: sources: no image at all.
    assert "![" not in markdown and "data:" not in markdown
    logged = {artifact.path for artifact in client.list_artifacts(run.info.run_id, "figures")}
    named = set(re.findall(r"artifact `(figures/[^`]+)`", markdown))
    handin = {
        name
        for language in ("en", "zh")
        for name in re.findall(r"artifact `(figures/[^`]+)`", (folder / f"handin.{language}.md").read_text())
    }
    assert named | handin == logged and GRAPH_FIGURE in named and len(named) >= 5
    assert handin - named == {
        f"figures/handin_{figure}.{language}.png" for figure in ("curves", "top_operators") for language in ("en", "zh")
    }
    html = (folder / "report.html").read_text()
    assert 'src="figures/' not in html
    assert html.count("data:image/png;base64,") == len([path for path in named if path.endswith(".png")])


def test_tool_variants_replace_every_figure_and_leave_the_rest() -> None:
    markdown = (
        "# Title\n\nText with [a link](https://example.com).\n\n![loss](figures/loss.png)\n\n![graph](figures/g.svg)\n"
    )
    tensorboard = markdown_for_tensorboard(markdown)
    assert "**Figure: loss**: TensorBoard's Images tab, tag `report/loss`." in tensorboard
    assert "**Figure: graph**: `figures/g.svg` is an MLflow artifact of this run" in tensorboard
    mlflow = markdown_for_mlflow(markdown)
    assert "**Figure: loss**: artifact `figures/loss.png` of this run" in mlflow
    for variant in (tensorboard, mlflow):
        assert variant.startswith("# Title\n\n_Figures: ") and "![" not in variant
        assert "Text with [a link](https://example.com)." in variant
