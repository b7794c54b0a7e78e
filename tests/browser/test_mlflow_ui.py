"""MLflow's own web UI, rendered by a real headless Chromium, shows the pipeline's runs without errors.

Not part of `make test` (it needs a browser): `make test-browser`, which CI runs where Chromium can be
installed. Chromium's `--dump-dom` runs the single-page app, lets it fetch from the real `mlflow server`
(`--virtual-time-budget`), and prints the DOM it built; `--screenshot` keeps a picture for a person.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.params.schema import TrackingConfig
from pipeline.tracking.tracker import open_tracker
from tests.helpers.servers import running_mlflow_server

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
ERROR_BANNERS = re.compile(r"Something went wrong|Request failed|Error:|Failed to fetch|Page not found", re.IGNORECASE)
COMBINATIONS = ("1-cpu-train", "64-cpu-train")


@pytest.fixture(scope="module")
def server_with_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str]]]:
    """A server over a store holding what the pipeline's tracker logs for two profile combinations."""
    if CHROMIUM is None:
        pytest.fail("no Chromium on PATH: install Debian's `chromium` package to run the browser tests")
    folder = tmp_path_factory.mktemp("ui")
    (folder / "params.yaml").write_text("profile: {batch_sizes: [1, 64]}\n")
    config = TrackingConfig(experiment="mnist-lab", tensorboard_dir="runs", registered_model="lab-model")
    run_ids = []
    for name in COMBINATIONS:
        batch = int(name.split("-")[0])
        with open_tracker("profile", config, variant=name, root=folder) as tracker:
            tracker.log_params({"batch_size": batch, "device": "cpu", "mode": "train"})
            tracker.log_metrics(
                {"step_time_ms_median": 0.5 * batch, "throughput_samples_per_s": 2000.0}, prefix="profile/"
            )
            run_ids.append(tracker.run_id)
    with running_mlflow_server(folder, f"sqlite:///{folder / 'mlflow.db'}") as uri:
        experiment = MlflowClient(uri).get_experiment_by_name("mnist-lab")
        yield uri, experiment.experiment_id, run_ids


def rendered_text(url: str, screenshot: Path) -> str:
    """The page's visible text after its scripts ran, and a screenshot of it."""
    flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000"]
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True).stdout
    subprocess.run(
        [*flags, "--window-size=1400,900", f"--screenshot={screenshot}", url], capture_output=True, timeout=180
    )
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.DOTALL)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def test_runs_page_lists_the_pipeline_run_without_errors(
    server_with_runs: tuple[str, str, list[str]], tmp_path: Path
) -> None:
    uri, experiment_id, _ = server_with_runs
    text = rendered_text(f"{uri}/#/experiments/{experiment_id}/runs", tmp_path / "runs.png")
    assert "mnist-lab" in text and "one run per DVC stage" in text  # the experiment and its description
    assert re.search(r"pipeline@none-[0-9a-f]{6}", text), text[:2000]  # the parent run, children below it
    assert "3 matching runs" in text
    assert not ERROR_BANNERS.search(text), ERROR_BANNERS.search(text)
    assert (tmp_path / "runs.png").stat().st_size > 10_000


def test_compare_view_lines_up_the_combinations(server_with_runs: tuple[str, str, list[str]], tmp_path: Path) -> None:
    uri, experiment_id, run_ids = server_with_runs
    query = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([experiment_id])})
    text = rendered_text(f"{uri}/#/compare-runs?{query}", tmp_path / "compare.png")
    assert "Comparing 2 Runs from 1 Experiment" in text
    assert all(f"profile@{name}" in text for name in COMBINATIONS)
    assert "profile/step_time_ms_median" in text and "batch_size" in text
    assert not ERROR_BANNERS.search(text), ERROR_BANNERS.search(text)
