"""MLflow's own web UI, rendered by a real headless Chromium, shows the pipeline's runs without errors.

Not part of `make test` (it needs a browser): `make test-browser`, which CI runs where Chromium can be
installed. Chromium's `--dump-dom` runs the single-page app, lets it fetch from the real `mlflow server`
(`--virtual-time-budget`), and prints the DOM it built; `--screenshot` keeps a picture for a person.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from mlflow import MlflowClient

from pipeline.common.browser import CHROMIUM, NO_CHROMIUM
from pipeline.common.outputs import AtomicOutputs
from pipeline.params.schema import TrackingConfig
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.store import ui_url
from tests.helpers.servers import running_mlflow_server

pytestmark = pytest.mark.browser
ERROR_BANNERS = re.compile(r"Something went wrong|Request failed|Error:|Failed to fetch|Page not found", re.IGNORECASE)
COMBINATIONS = ("1-cpu-train", "64-cpu-train")


class Store(NamedTuple):
    uri: str  # the server's
    experiment_id: str
    run_ids: list[str]  # the profile runs, in COMBINATIONS' order
    report_id: str  # a report made inside a DVC experiment from the baseline's profile outputs


@pytest.fixture(scope="module")
def server_with_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A server over a store holding what the pipeline's tracker logs for two profile combinations, and a report
    run that `dvc exp run` made from their outputs (the stages it did not rerun)."""
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    folder = tmp_path_factory.mktemp("ui")
    (folder / "params.yaml").write_text("profile: {batch_sizes: [1, 64]}\n")
    run_ids = []
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # outputs are written relative to the working folder, as under DVC
        patch.delenv("DVC_EXP_NAME", raising=False)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        for name in COMBINATIONS:
            batch = int(name.split("-")[0])
            with open_tracker("profile", CONFIG, variant=name, root=folder) as tracker, AtomicOutputs() as outputs:
                tracker.log_params({"batch_size": batch, "device": "cpu", "mode": "train"})
                tracker.log_metrics(
                    {"step_time_ms_median": 0.5 * batch, "throughput_samples_per_s": 2000.0}, prefix="profile/"
                )
                outputs.write_text(Path(f"profiles/{name}/profile.json"), json.dumps({"median_ms": 0.5 * batch}))
                run_ids.append(tracker.run_id)
        patch.setenv("DVC_EXP_NAME", "brisk-lark")
        with open_tracker("report", CONFIG, root=folder) as tracker:
            found = tracker.link_inputs(READS, "The lab report.")
            report_id = tracker.run_id
    assert found == dict(zip(READS, run_ids, strict=True))
    with running_mlflow_server(folder, f"sqlite:///{folder / 'mlflow.db'}") as uri:
        experiment = MlflowClient(uri).get_experiment_by_name("mnist-lab")
        yield Store(uri, experiment.experiment_id, run_ids, report_id)


CONFIG = TrackingConfig(experiment="mnist-lab", tensorboard_dir="runs", registered_model="lab-model")
READS = {f"profile@{name}": Path(f"profiles/{name}/profile.json") for name in COMBINATIONS}


def rendered_text(url: str, screenshot: Path) -> str:
    """The page's visible text after its scripts ran, and a screenshot of it."""
    flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000"]
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True).stdout
    subprocess.run(
        [*flags, "--window-size=1400,900", f"--screenshot={screenshot}", url], capture_output=True, timeout=180
    )
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.DOTALL)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def test_runs_page_lists_the_pipeline_run_without_errors(server_with_runs: Store, tmp_path: Path) -> None:
    """The page the stages and the README point at (ui_url): MLflow's model-training view of the runs, not the
    GenAI overview MLflow 3 opens on by default."""
    uri, experiment_id, _, _ = server_with_runs
    text = rendered_text(ui_url(uri, experiment_id), tmp_path / "runs.png")
    assert "mnist-lab" in text and "one run per DVC stage" in text  # the experiment and its description
    assert " Model registry " in text and " Runs " in text
    assert not re.search(r"Agent versions|Judges|Evaluations|Overview", text), text[:2000]
    assert re.search(r"pipeline@none-[0-9a-f]{6}", text), text[:2000]  # the parent run, children below it
    assert "5 matching runs" in text  # two pipeline parents (baseline, experiment), two profiles, the report
    assert not ERROR_BANNERS.search(text), ERROR_BANNERS.search(text)
    assert (tmp_path / "runs.png").stat().st_size > 10_000


def test_compare_view_lines_up_the_combinations(server_with_runs: Store, tmp_path: Path) -> None:
    uri, experiment_id, run_ids, _ = server_with_runs
    query = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([experiment_id])})
    text = rendered_text(f"{uri}/#/compare-runs?{query}", tmp_path / "compare.png")
    assert "Comparing 2 Runs from 1 Experiment" in text
    assert all(f"profile@{name}" in text for name in COMBINATIONS)
    assert "profile/step_time_ms_median" in text and "batch_size" in text
    assert not ERROR_BANNERS.search(text), ERROR_BANNERS.search(text)


def test_a_dvc_experiments_report_links_to_the_baselines_runs_in_the_ui(
    server_with_runs: Store, tmp_path: Path
) -> None:
    """The links in the description of a report made inside `dvc exp run` open the runs that wrote what it read,
    in the model-training view."""
    uri, experiment_id, run_ids, report_id = server_with_runs
    note = MlflowClient(uri).get_run(report_id).data.tags["mlflow.note.content"]
    links = re.findall(r"\[(profile@[^\]]+)\]\((#/experiments/[^)]+)\)", note)
    assert [name for name, _ in links] == list(READS)
    for (name, link), run_id in zip(links, run_ids, strict=True):
        assert link == ui_url("", experiment_id, run_id)
        text = rendered_text(f"{uri}/{link}", tmp_path / f"{name}.png")
        assert name in text and "profile/step_time_ms_median" in text, text[:2000]
        assert not ERROR_BANNERS.search(text) and "Agent versions" not in text
