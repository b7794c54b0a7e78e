"""The report stage's edges, on the real stage (stages.report.main, run as its script runs it): every input it
reads is checked (a truncated, empty, incomplete or NaN-holding stage output stops it with one paragraph naming the
file and `dvc repro -f <stage>`, exit 2, no traceback, and the report it wrote before left byte for byte); a direct
run removes what its new report no longer holds; a full disk under its figures names the figure."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.common.stage_runner import run_stage
from stages import report as report_stage
from tests.helpers.records import write_two_profiles
from tests.helpers.repo import REPO_ROOT
from tests.helpers.stores import empty_store

pytestmark = pytest.mark.slow  # the real stage: MLflow in process

TRAIN_METRICS = {"epochs": 1, "steps": 2, "test_accuracy": 0.9, "test_loss": 0.3, "train_accuracy": 0.8}
TRAIN_METRICS["train_loss"] = 0.5
INPUTS = {
    "metrics/train.json": json.dumps(TRAIN_METRICS, indent=2) + "\n",
    "metrics/train_speed.json": json.dumps(
        {
            "images_per_second": 118.0,
            "train_seconds": 10.0,
            "cpu_share": 0.99,
            "machine_busy": False,
            "runtime": {"device": "cpu", "precision": "bf16", "execution": "eager", "threads": 2},
        }
    ),
    "metrics/graph.json": json.dumps({"total_parameters": 1199882, "forward_flops_per_sample": 23984896}),
    "hardware/fingerprint.json": json.dumps(
        {
            "cpu": "Intel Xeon",
            "cpu_count": "2",
            "gpus": "none",
            "machine": "x86_64",
            "os": "Linux 6.1",
            "python": "3.11.7",
            "torch": "2.15.0",
            "torch_cuda_build": "13.2",
            "torchvision": "0.29.2",
        }
    ),
    "graph/summary.md": "### Model summary\n\n| layer | parameters |\n| --- | --- |\n| conv1 | 320 |\n",
    "plots/train_epochs.csv": "epoch,lr,train_loss,train_accuracy,test_loss,test_accuracy\n1,1,0.5,0.8,0.3,0.9\n",
    "plots/train_steps.csv": "step,epoch,train_loss,train_accuracy\n1,1,0.6,0.7\n2,1,0.5,0.8\n",
}
TABLE = "profiles/cpu/64-inference/top_operators.md"


@pytest.fixture(autouse=True)
def _no_tracking_uri_left() -> Iterator[None]:
    """mlflow.set_tracking_uri (each stage run here, in process) sets $MLFLOW_TRACKING_URI: gone after each test, so
    that no later test or child process logs into this test's store."""
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


def _json_with(relative: str, **changes: Any) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        found = json.loads((root / relative).read_text())
        found.update(changes)
        (root / relative).write_text(json.dumps(found, allow_nan=True))

    return change


def _without(relative: str, key: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        found = json.loads((root / relative).read_text())
        del found[key]
        (root / relative).write_text(json.dumps(found))

    return change


def _text(relative: str, make: Callable[[str], str]) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        (root / relative).write_text(make((root / relative).read_text()))

    return change


# (case, damage, the message's file, what it says, the stage to rerun)
DAMAGES: list[tuple[str, Callable[[Path], None], str, str, str]] = [
    ("train.json truncated", _text("metrics/train.json", lambda t: t[: len(t) // 2]), "metrics/train.json",
     "is not valid JSON (cut short?)", "train"),
    ("train.json empty", _text("metrics/train.json", lambda t: ""), "metrics/train.json", "is empty", "train"),
    ("train.json missing key", _without("metrics/train.json", "test_accuracy"), "metrics/train.json",
     "has no `test_accuracy`", "train"),
    ("train.json NaN", _json_with("metrics/train.json", test_accuracy=float("nan")), "metrics/train.json",
     "holds NaN", "train"),
    ("train.json infinite", _text("metrics/train.json", lambda t: t.replace("0.3", "1e999")), "metrics/train.json",
     "`test_loss` is inf, not a finite number", "train"),
    ("fingerprint empty", _text("hardware/fingerprint.json", lambda t: ""), "hardware/fingerprint.json", "is empty",
     "validate"),
    ("fingerprint missing key", _without("hardware/fingerprint.json", "cpu"), "hardware/fingerprint.json",
     "has no `cpu`", "validate"),
    ("train_speed infinite", _json_with("metrics/train_speed.json", images_per_second=float("inf")),
     "metrics/train_speed.json", "holds Infinity", "train"),
    ("train_speed a text", _json_with("metrics/train_speed.json", images_per_second="fast"),
     "metrics/train_speed.json", '`images_per_second` is "fast", not a number', "train"),
    ("graph.json truncated", _text("metrics/graph.json", lambda t: t[:-5]), "metrics/graph.json",
     "is not valid JSON", "export_graph"),
    ("graph.json a list", _text("metrics/graph.json", lambda t: "[1, 2]"), "metrics/graph.json",
     "is not a JSON object (it holds a list)", "export_graph"),
    ("summary empty", _text("graph/summary.md", lambda t: "\n"), "graph/summary.md", "is empty", "export_graph"),
    ("epochs CSV header only", _text("plots/train_epochs.csv", lambda t: t.splitlines(keepends=True)[0]),
     "plots/train_epochs.csv", "has only its header, no rows", "train"),
    ("epochs CSV cut mid-row", _text("plots/train_epochs.csv", lambda t: t[:-4]), "plots/train_epochs.csv",
     "ends mid-row", "train"),
    ("steps CSV short row", _text("plots/train_steps.csv", lambda t: t + "3,1,0.4\n"), "plots/train_steps.csv",
     "line 4: 3 values where the header has 4", "train"),
    ("steps CSV NaN", _text("plots/train_steps.csv", lambda t: t.replace("0.6", "nan")), "plots/train_steps.csv",
     "line 2: `train_loss` is nan, not a finite number", "train"),
    ("epochs CSV empty", _text("plots/train_epochs.csv", lambda t: ""), "plots/train_epochs.csv", "is empty", "train"),
    ("top operators deleted", lambda root: (root / TABLE).unlink(), TABLE, "is missing", "profile@cpu"),
    ("top operators empty", _text(TABLE, lambda t: ""), TABLE, "is empty", "profile@cpu"),
]  # fmt: skip


@pytest.fixture
def project(tmp_path: Path, repo_params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose every report input is complete, and whose report was written before."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    repo_params["profile"].update(batch_sizes=[1, 64], devices=["cpu"], modes=["inference"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(repo_params))
    empty_store(tmp_path)
    write_two_profiles()
    for relative, text in INPUTS.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    return tmp_path


def _report(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # mlflow.set_tracking_uri sets it
    try:
        run_stage("report", report_stage.main)
    except SystemExit as exited:
        captured = capsys.readouterr()
        return int(exited.code or 0), captured.out, captured.err
    captured = capsys.readouterr()
    return 0, captured.out, captured.err


def _outputs(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted((root / "report").rglob("*")) if
            path.is_file()}  # fmt: skip


@pytest.mark.parametrize(("case", "damage", "relative", "says", "stage"), DAMAGES, ids=[case for case, *_ in DAMAGES])
def test_a_damaged_report_input_stops_the_stage_naming_the_file_and_its_stage(
    project: Path,
    case: str,
    damage: Callable[[Path], None],
    relative: str,
    says: str,
    stage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, stderr = _report(capsys, monkeypatch)
    assert code == 0, stderr
    before = _outputs(project)
    assert "report/report.md" in before and "Test accuracy **0.9000**" in before["report/report.md"].decode()
    damage(project)
    code, stdout, stderr = _report(capsys, monkeypatch)
    assert code == 2 and "Traceback" not in stderr, stderr
    paragraph = stderr.strip()
    assert paragraph.startswith(f"error in stage 'report': {relative}") and "\n" not in paragraph, stderr
    assert says in paragraph and f"rerun `dvc repro -f {stage}`" in paragraph, paragraph
    assert "report written" not in stdout
    assert _outputs(project) == before  # the last good report stays


def test_a_direct_run_removes_the_files_its_new_report_no_longer_holds(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, stderr = _report(capsys, monkeypatch)
    assert code == 0, stderr
    first = set(_outputs(project))
    assert {"report/handin.zh.md", "report/handin.zh.html", "report/figures/training_curves.png"} <= first
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["report"]["languages"] = ["en"]
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    for relative in ("plots/train_epochs.csv", "plots/train_steps.csv"):  # no curves to draw any more
        (project / relative).unlink()
    code, _, stderr = _report(capsys, monkeypatch)
    assert code == 0, stderr
    second = _outputs(project)
    assert first - set(second) == {
        "report/handin.zh.md",
        "report/handin.zh.html",
        "report/figures/training_curves.png",
        "report/figures/handin_curves.en.png",
        "report/figures/handin_curves.zh.png",
        "report/figures/handin_top_operators.zh.png",  # each language's figures go with it
    }
    assert "_Training curves not available (see Missing inputs)._" in second["report/report.md"].decode()
    assert [path.name for path in (project / "report").rglob(".*")] == []  # no temp folder left


FULL_FIGURES_SCRIPT = r"""
set -e
mkdir -p report/figures
mount -t tmpfs -o size=8m tmpfs report/figures
python -c 'open("report/figures/filler", "wb").write(bytes((8 << 20) - (8 << 10)))'
set +e
python -m stages.report
echo "exit $?" >&2
"""


def test_a_full_disk_under_the_figures_names_the_figure_it_could_not_write(project: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    environment["PATH"] = f"{Path(sys.executable).parent}:{environment['PATH']}"
    environment["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        ["unshare", "-rm", "bash", "-c", FULL_FIGURES_SCRIPT],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "unshare:" in result.stderr:
        pytest.fail(f"needs `unshare -rm` to mount a small tmpfs without root: {result.stderr[-500:]}")
    stderr = result.stderr
    assert "exit 2" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert re.search(
        r"error in stage 'report': could not write report/figures/[\w.]+\.png \(No space left on device\): the "
        r"file system holding report/figures/ is full",
        stderr,
    ), stderr[-3000:]
    assert not (project / "report" / "report.md").exists()  # nothing was written
