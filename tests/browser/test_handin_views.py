"""`make handin-views` on a reproduced project (`make test-browser`; needs Debian's `chromium`): TensorBoard's GRAPHS
and SCALARS views of its current training photographed from a real `tensorboard`, each only once its page shows the
model's opened graph or the four curves; the report stage then puts both in the hand-ins' 截图 cells, and leaves
them out, saying why, once the training they show is no longer the project's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from pipeline.common.browser import CHROMIUM, NO_CHROMIUM
from pipeline.report.catalogue import load_catalogue
from tests.helpers.projects import clone_project, run_command, stage_environment


def _without_views(source: Path, target: Path) -> Path:
    """A clone of `source` whose views/ holds its README alone (the tree copied may carry pictures of its own)."""
    project = clone_project(source, target)
    for path in (project / "views").iterdir():
        if path.name != "README.md":
            path.unlink()
    return project


pytestmark = pytest.mark.browser


def test_the_views_are_taken_from_the_current_runs_and_shown_in_the_handin_while_current(
    reproduced_project: Path, tmp_path: Path, mnist_mirror: Path
) -> None:
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    project = _without_views(reproduced_project, tmp_path / "project")
    environment = stage_environment(mnist_mirror)
    taken = run_command(["python", "-m", "pipeline.report.tensorboard_views"], project, environment)
    assert taken.returncode == 0, taken.stdout + taken.stderr
    record = json.loads((project / "views/views.json").read_text())
    assert set(record["runs"]) == {"train", "export_graph"}
    for name in ("tensorboard-graph.png", "tensorboard-scalars.png"):
        with Image.open(project / "views" / name) as picture:
            assert picture.size[0] == 1400 and picture.size[1] > 600  # the window, less its headless chrome
            assert len(picture.getcolors(1 << 16) or range(1 << 16)) > 50  # a page, not a blank

    report = run_command(["dvc", "repro", "report"], project, environment)
    assert report.returncode == 0, report.stdout + report.stderr
    for language in ("zh", "en"):
        catalogue = load_catalogue(language)
        handin = (project / f"report/handin.{language}.md").read_text()
        assert f"![{catalogue('view_graph_label')}](figures/tensorboard-graph.png)" in handin
        assert f"![{catalogue('view_scalars_label')}](figures/tensorboard-scalars.png)" in handin
        # The line names the runs the pictures were taken from, as views.json records them.
        runs = {"train": record["runs"]["train"][:8], "export": record["runs"]["export_graph"][:8]}
        assert catalogue("tensorboard_line", **runs) in handin and catalogue("views_missing") not in handin
    assert (project / "report/figures/tensorboard-graph.png").read_bytes() == (
        project / "views/tensorboard-graph.png"
    ).read_bytes()

    # Another training's metrics: the pictures no longer go with the project's training.
    metrics = project / "metrics/train.json"
    metrics.write_text(metrics.read_text().replace("{", '{"retrained": 1, ', 1))
    stale = run_command(["python", "-m", "stages.report"], project, environment)
    assert stale.returncode == 0, stale.stdout + stale.stderr
    handin = (project / "report/handin.zh.md").read_text()
    assert "tensorboard-graph.png" not in handin
    assert load_catalogue("zh")("views_stale", path="metrics/train.json") in handin


def test_without_chromium_the_command_says_how_to_get_it_and_writes_nothing(
    reproduced_project: Path, tmp_path: Path, mnist_mirror: Path
) -> None:
    project = _without_views(reproduced_project, tmp_path / "project")
    environment = stage_environment(mnist_mirror)
    environment["PATH"] = os.pathsep.join(  # the venv's programs, not the system's Chromium
        part for part in environment["PATH"].split(os.pathsep) if part.endswith(".venv/bin")
    )
    result = run_command(["python", "-m", "pipeline.report.tensorboard_views"], project, environment)
    assert result.returncode == 2  # a user's fix, not a failure of the command
    assert "no Chromium on PATH" in result.stderr and "make handin-views" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(path.name for path in (project / "views").iterdir()) == ["README.md"]
