"""End to end: the real `dvc repro` of the download stage in a temp copy, then the stores read back."""

from __future__ import annotations

import gzip
import io
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow import MlflowClient
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.data.artifacts import sample_grid
from pipeline.data.mnist import MNIST_SHA256, dataset_digest, load_split
from tests.helpers.projects import write_params
from tests.helpers.servers import closed_port

pytestmark = pytest.mark.slow


def _runs(project: Path, experiment: str = "mnist-lab") -> list[Any]:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, "the stage did not create its MLflow experiment"
    return client.search_runs([found.experiment_id], filter_string="tags.stage = 'download'")  # not the pipeline parent


def test_dvc_repro_downloads_logs_and_is_idempotent(project_copy: Path, run_in: Any) -> None:
    first = run_in(project_copy, "dvc", "repro", "download")
    assert first.returncode == 0, first.stderr
    images, labels = load_split(project_copy / "data", "train")
    assert images.shape == (60_000, 28, 28)

    second = run_in(project_copy, "dvc", "repro", "download")
    assert second.returncode == 0, second.stderr
    assert "didn't change, skipping" in second.stdout
    assert "Running stage 'download'" not in second.stdout
    assert "Running stage 'validate'" in second.stdout  # every `dvc repro` checks params and this machine first
    status = run_in(project_copy, "dvc", "status", "download")
    assert "up to date" in status.stdout

    # MLflow: exactly one finished run, with digests, counts and both dataset inputs.
    (run,) = _runs(project_copy)
    assert run.info.status == "FINISHED"
    assert run.data.tags["data.digest"] == dataset_digest(MNIST_SHA256)
    assert run.data.tags["stage"] == "download"
    assert run.data.metrics["data/train_samples"] == 60_000 and run.data.metrics["data/test_samples"] == 10_000
    assert {key.split("/")[0] for key in run.data.metrics} == {"data"}  # one section in MLflow
    assert run.data.params["source.train-images-idx3-ubyte"].endswith("train-images-idx3-ubyte.gz")
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"mnist-train", "mnist-test"}
    assert {tag.value for tag in inputs["mnist-train"].tags if tag.key == "mlflow.data.context"} == {"training"}
    artifacts = {
        a.path for a in MlflowClient(f"sqlite:///{project_copy / 'mlflow.db'}").list_artifacts(run.info.run_id)
    }
    assert "samples_by_class.png" in artifacts
    assert (project_copy / "mlartifacts").is_dir()  # artifacts stay in the project root

    # TensorBoard: the sample grid, read back with TensorBoard's reader, equals the real digits.
    (logdir,) = (project_copy / "runs" / "download").iterdir()
    assert run.info.run_id[:8] in logdir.name
    events = EventAccumulator(str(logdir), size_guidance={"images": 0})
    events.Reload()
    (image_event,) = events.Images("data/train_samples_by_class")
    # The counts are one number each: a table in the Text tab, not four single-point cards in Scalars.
    assert events.Tags()["scalars"] == []
    summary = events.Tensors("data/metrics/text_summary")[0].tensor_proto.string_val[0].decode()
    for key in ("data/train_samples", "data/train_bytes", "data/test_samples", "data/test_bytes"):
        assert f"| `{key}` | {run.data.metrics[key]:.6g} |" in summary
    shown = np.asarray(Image.open(io.BytesIO(image_event.encoded_image_string)).convert("L"))
    assert np.array_equal(shown, sample_grid(images, labels, per_class=10)[:, :, 0])


def test_the_stage_never_imports_torch(project_copy: Path, run_in: Any) -> None:
    """Its sample grid reaches TensorBoard as a PNG that PIL encodes: `import torch` (~3 s) would double the stage.
    The stage's process ends once it is done (`run_stage_process`), atexit callbacks run: the check is one."""
    probe = (
        "import atexit, runpy, sys; "
        "atexit.register(lambda: print('torch imported' if 'torch' in sys.modules else 'no torch')); "
        "sys.argv = ['stages.download']; runpy.run_module('stages.download', run_name='__main__')"
    )
    result = run_in(project_copy, sys.executable, "-c", probe)
    assert result.returncode == 0 and "no torch" in result.stdout, result.stderr[-2000:]
    assert (project_copy / "data" / "MNIST").is_dir()


def test_corrupt_mirror_fails_clearly_and_leaves_no_output(
    project_copy: Path, repo_params: dict[str, Any], run_in: Any, mnist_mirror: Path, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt-mirror"
    shutil.copytree(mnist_mirror, corrupt)
    truncated = corrupt / "train-labels-idx1-ubyte.gz"
    content = gzip.decompress(truncated.read_bytes())
    truncated.write_bytes(gzip.compress(content[:-100], compresslevel=1))
    repo_params["data"]["mirrors"] = [f"http://127.0.0.1:{closed_port()}/mnist/"]
    write_params(project_copy, repo_params)

    result = run_in(project_copy, "dvc", "repro", "download", env={"MNIST_MIRROR": str(corrupt)})
    assert result.returncode != 0
    assert "could not get a verified copy of MNIST file train-labels-idx1-ubyte" in result.stderr
    assert f"expected {MNIST_SHA256['train-labels-idx1-ubyte']}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (project_copy / "data" / "MNIST").exists()
    assert [p.name for p in (project_copy / "data").iterdir()] == [".gitignore"]  # no partial folders
    (run,) = _runs(project_copy)
    assert run.info.status == "FAILED"
