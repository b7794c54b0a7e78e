"""MLflow's own artifact preview, rendered by headless Chromium, shows the logged report.md without a broken
image or image markdown printed as text (`make test-browser`; needs Debian's `chromium`).

MLflow 3.17 prints a scheme-less image as the text `[alt](src)` and renders a data: image as `<img src="">`:
the logged report.md names each figure's artifact instead (see pipeline/report/lab_report.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.common.browser import CHROMIUM, NO_CHROMIUM
from tests.helpers.projects import run_report_stage
from tests.helpers.servers import running_mlflow_server

pytestmark = pytest.mark.browser


def test_mlflow_previews_the_logged_report_with_each_figure_named(tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    project = tmp_path / "project"
    project.mkdir()
    run_report_stage(project, "report-preview")
    with running_mlflow_server(project, f"sqlite:///{project / 'mlflow.db'}") as uri:
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("report-preview")
        assert experiment is not None
        (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'report'")
        url = f"{uri}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}/artifacts/report.md"
        flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000"]
        dom = subprocess.run(
            [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True
        ).stdout
    assert "artifact-markdown-view-error" not in dom
    visible = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.DOTALL)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", visible))
    assert "](figures/" not in text  # no image markdown printed as text
    assert '<img src=""' not in dom  # no emptied (data:) image
    for name in ("training_curves.png", "per_sample_time.png", "throughput.png", "roofline.png", "model_graph.svg"):
        assert f"artifact figures/{name} of this run" in text, name  # rendered (the source view keeps backticks)
