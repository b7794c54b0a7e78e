"""The lab guide's screenshots (docs/lab-guide.md): each page a student opens, what the guide says it shows, and
`make screenshots`, which retakes them from the project's last `dvc repro` in headless Chromium.

A screenshot is taken only once its page shows every text the guide says it shows (`Shot.shows`), so a retaken
picture cannot show a page that no longer does; tests/browser/test_lab_guide.py runs the same shots on a freshly
reproduced project and fails where a page lacks one.

Usage: `python -m tests.helpers.guide [PROJECT] [--into FOLDER]` (defaults: this project, docs/images).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from mlflow import MlflowClient

from pipeline.common.browser import Page, chromium_page
from pipeline.report.tensorboard_views import open_labnet
from tests.helpers.servers import running_mlflow_server, running_tensorboard

IMAGES = Path("docs/images")
CURRENT = "tags.`dvc.outputs` = 'current'"  # the runs whose outputs are the project's current ones


@dataclass(frozen=True)
class Places:
    """Where a reproduced project's pages are."""

    mlflow: str  # the server's URL
    tensorboard: str
    experiment_id: str
    profile_run_id: str  # the current profile@64-cpu-train run
    handin: Path  # report/handin.zh.html


@dataclass(frozen=True)
class Shot:
    name: str  # docs/images/<name>.png
    step: int  # the guide's step it illustrates
    url: Callable[[Places], str]
    shows: tuple[str, ...]  # texts the page shows, as the guide says
    loaded: tuple[str, ...] = ()  # texts that say the page has loaded, before `then`
    then: Callable[[Page], None] = lambda page: None  # what a student does before looking (a click, a scroll)


def _runs_expanded(page: Page) -> None:
    """The stage runs of the newest `dvc repro`, opened under its pipeline run (the [+] beside it), without MLflow's
    assistant panel over them."""
    page.click("Close")
    expand = (
        "(() => { const button = document.querySelector('button[data-component-id*=runnamecellrenderer]');"
        " if (button) button.click(); return Boolean(button); })()"
    )
    deadline = time.monotonic() + 60
    while not page.evaluate(expand) and time.monotonic() < deadline:  # the table fills in after the page
        time.sleep(1)


def _to_batch_table(page: Page) -> None:
    page.evaluate("document.querySelectorAll('h3')[1].scrollIntoView()")


SHOTS = (
    Shot(
        "mlflow-runs",
        2,
        lambda at: (
            f"{at.mlflow}/#/experiments/{at.experiment_id}/runs?workflowType=machine_learning"
            f"&searchFilter={urllib.parse.quote(CURRENT)}"
        ),
        ("train", "export_graph", "profile@64-cpu-train", "report"),
        ("pipeline@",),
        _runs_expanded,
    ),
    Shot(
        "tensorboard-graph",
        3,
        lambda at: f"{at.tensorboard}/#graphs",
        ("LabNet", "Subgraph"),
        ("Main Graph", "LabNet"),
        open_labnet,
    ),
    Shot(
        "tensorboard-curves",
        4,
        lambda at: f"{at.tensorboard}/#custom_scalars",
        ("loss: train (per logged window) and test (per epoch)", "accuracy: train (per logged window)"),
    ),
    Shot(
        "mlflow-operators",
        5,
        lambda at: (
            f"{at.mlflow}/#/experiments/{at.experiment_id}/runs/{at.profile_run_id}/artifacts/top_operators.md"
            "?workflowType=machine_learning"
        ),
        ("operators: batch 64, cpu, train", "aten::convolution_backward", "self CPU ms"),
        (),
        lambda page: page.click("Close"),
    ),
    Shot(
        "handin-batches", 6, lambda at: at.handin.as_uri(), ("批大小", "结果比较", "单样本耗时"), then=_to_batch_table
    ),
)


def take(shots: tuple[Shot, ...], places: Places, page: Page, into: Path, settle_s: float = 3) -> dict[str, list[str]]:
    """Each shot's page opened until it shows what the guide says, then photographed into `into`; returns, per
    shot, the texts its page did not show (no picture is taken of such a page)."""
    missing: dict[str, list[str]] = {}
    for shot in shots:
        _, lacking = page.open_until(shot.url(places), shot.loaded)
        if not lacking:
            shot.then(page)
            _, lacking = page.wait_for(shot.shows)
        if not lacking:
            time.sleep(settle_s)  # charts and the graph animate into place
            page.screenshot(into / f"{shot.name}.png")
        missing[shot.name] = lacking
    return missing


def retake(project: Path, into: Path, scratch: Path) -> dict[str, list[str]]:
    """Every shot of `project`'s current runs (its last `dvc repro`) into `into`: MLflow's own server over its store,
    TensorBoard over a copy of the current runs' folders only (older runs would crowd its pages)."""
    tracking = yaml.safe_load((project / "params.yaml").read_text())["tracking"]
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(tracking["experiment"])
    if experiment is None:
        raise SystemExit(f"no MLflow experiment {tracking['experiment']!r} in {project}: run `dvc repro` first")
    runs = client.search_runs([experiment.experiment_id], filter_string=CURRENT, max_results=100)
    profile = next((run for run in runs if run.info.run_name == "profile@64-cpu-train"), None)
    if profile is None:
        raise SystemExit(f"no current profile@64-cpu-train run in {project}: the guide's pages need the default matrix")
    logs, current = project / tracking["tensorboard_dir"], scratch / "runs"
    for run in runs:
        for folder in logs.glob(f"*/*{run.info.run_id[:8]}"):
            shutil.copytree(folder, current / folder.relative_to(logs))
    shutil.copytree(logs / "hparams", current / "hparams")  # the Custom Scalars layout
    with (
        running_mlflow_server(scratch, f"sqlite:///{project / 'mlflow.db'}") as mlflow_url,
        running_tensorboard(current) as tensorboard_url,
        chromium_page(scratch / "chromium", "1400,900") as page,
    ):
        handin = project / "report" / "handin.zh.html"
        places = Places(mlflow_url, tensorboard_url, experiment.experiment_id, profile.info.run_id, handin)
        return take(SHOTS, places, page, into)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", nargs="?", type=Path, default=Path("."))
    parser.add_argument("--into", type=Path, default=IMAGES)
    arguments = parser.parse_args()
    arguments.into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        missing = retake(arguments.project.resolve(), arguments.into, Path(scratch))
    for name, lacking in missing.items():
        print(f"{arguments.into / name}.png: " + (f"NOT retaken, the page lacks {lacking}" if lacking else "retaken"))
    if any(missing.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
