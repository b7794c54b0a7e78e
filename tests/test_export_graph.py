"""Export-graph stage: summary table (in process) and `dvc repro export_graph` read back from every output."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.data.mnist import load_split
from pipeline.data.tensors import normalize_images
from pipeline.model.checkpoint import load_checkpoint
from pipeline.model.network import LabNet
from pipeline.model.summary import summarize, summary_csv, summary_markdown
from tests.helpers.data import LAB_MODEL
from tests.helpers.projects import clone_project, read_params, write_params


def test_summary_counts_every_parameter_and_the_convolution_flops() -> None:
    model = LabNet(LAB_MODEL)
    summary = summarize(model, model.input_shape)
    assert summary.total_parameters == sum(p.numel() for p in model.parameters()) == 1_199_882
    assert sum(row.parameters for row in summary.rows) == summary.total_parameters
    rows = {row.layer: row for row in summary.rows}
    assert rows["features.conv2"].output_shape == "64x24x24"
    assert rows["features.conv2"].flops_per_sample == 2 * 24 * 24 * 64 * 32 * 3 * 3  # multiply-adds × 2
    assert rows["classifier.fc1"].parameters == 9216 * 128 + 128
    assert rows["features.relu2"].flops_per_sample == 0
    assert summary.forward_flops_per_sample == sum(row.flops_per_sample for row in summary.rows)
    assert summary.training_flops_per_sample == pytest.approx(3 * summary.forward_flops_per_sample, rel=0.02)
    assert model.training  # summarize() restored the mode it found
    markdown = summary_markdown(summary)
    assert "| features.conv1 | Conv2d | 32x26x26 | 320 | 389,376 |" in markdown
    assert summary_csv(summary).splitlines()[-1] == "total,,,1199882,23984896"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, reproduced_project: Path) -> Path:
    return clone_project(reproduced_project, tmp_path_factory.mktemp("exported") / "project")


def _test_batch(project: Path, size: int) -> torch.Tensor:
    images, _ = load_split(project / "data", "test")
    return normalize_images(images[:size])


@pytest.mark.slow
def test_tensorboard_graph_has_the_lab_operators(exported: Path) -> None:
    (logdir,) = (exported / "runs" / "export_graph").iterdir()
    events = EventAccumulator(str(logdir))
    events.Reload()
    graph = events.Graph()
    operators = {node.op for node in graph.node}
    assert {"aten::_convolution", "aten::linear", "aten::max_pool2d", "aten::relu", "aten::log_softmax"} <= operators
    assert any("Conv2d[conv2]" in node.name for node in graph.node)
    summary_text = events.Tensors("graph/summary/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| classifier.fc1 | Linear | 128 | 1,179,776 |" in summary_text
    # The totals as a table of their own beside it (a second text under `graph/summary` had hidden the model's).
    metrics_text = events.Tensors("graph/metrics/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| `graph/total_parameters` | 1.19988e+06 |" in metrics_text


@pytest.mark.slow
def test_portable_programs_accept_any_batch_and_match_pytorch(exported: Path) -> None:
    model = load_checkpoint(exported / "models/model.pt").model
    program = torch.export.load(exported / "graph/model.pt2").module()
    onnx.checker.check_model(str(exported / "graph/model.onnx"), full_check=True)
    session = onnxruntime.InferenceSession(str(exported / "graph/model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_input,) = session.get_inputs()
    assert onnx_input.shape[0] == "batch"  # symbolic, not a fixed number
    for batch in (1, 16, 64, 7):
        images = _test_batch(exported, batch)
        with torch.no_grad():
            expected = model(images)
            assert torch.equal(program(images), expected)
        (onnx_output,) = session.run(None, {onnx_input.name: images.numpy()})
        assert np.abs(onnx_output - expected.numpy()).max() < 1e-4
    text = (exported / "graph/model_pt2_graph.txt").read_text()
    assert "torch.ops.aten.conv2d.default" in text and str(exported) not in text


@pytest.mark.slow
def test_the_programs_say_where_each_node_comes_from_without_the_checkouts_folder(exported: Path) -> None:
    """Source locations relative to the checkout or the installed packages: clones at different paths export the
    same bytes."""
    with zipfile.ZipFile(exported / "graph/model.pt2") as archive:
        pt2 = "".join(archive.read(name).decode(errors="replace") for name in archive.namelist())
    model = onnx.load(str(exported / "graph/model.onnx"), load_external_data=False)
    traces = [p.value for node in model.graph.node for p in node.metadata_props if p.key.endswith("stack_trace")]
    for where in (pt2, "\n".join(traces)):
        locations = set(re.findall(r'File \\?"([^"\\]+)', where))
        assert {"pipeline/model/network.py", "torch/nn/modules/conv.py"} <= locations
        assert not [location for location in locations if location.startswith("/")]


@pytest.mark.slow
def test_summary_metrics_picture_and_mlflow_run(exported: Path) -> None:
    model = load_checkpoint(exported / "models/model.pt").model
    parameters = sum(p.numel() for p in model.parameters())
    metrics = json.loads((exported / "metrics/graph.json").read_text())
    assert metrics["total_parameters"] == parameters
    assert metrics["onnxruntime_max_abs_difference"] < 1e-4
    table = json.loads((exported / "graph/summary.json").read_text())
    assert sum(layer["parameters"] for layer in table["layers"]) == parameters
    assert (exported / "graph/summary.csv").read_text().splitlines()[-1].startswith(f"total,,,{parameters},")

    svg = ElementTree.parse(exported / "graph/model_graph.svg").getroot()
    texts = {element.text for element in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"features.conv2", "aten.conv2d", "N×64×24×24", "classifier.fc1.weight"} <= texts

    client = MlflowClient(f"sqlite:///{exported / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'export_graph'")
    assert run.info.status == "FINISHED"
    assert run.data.metrics["graph/total_parameters"] == parameters
    assert {key.split("/")[0] for key in run.data.metrics} == {"graph"}  # one section in MLflow
    # It points at the train run that wrote the checkpoint and at the model that run logged.
    (train,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")
    assert run.data.tags["train.run_id"] == train.info.run_id
    assert run.data.tags["model.id"] == train.data.tags["model.id"]
    assert run.data.tags["model.uri"] == f"models:/{train.data.tags['model.id']}"
    assert run.data.tags["model.digest"] == train.data.tags["model.digest"]
    # search_runs leaves model inputs out (MLflow 3.17); get_run has them.
    assert [m.model_id for m in client.get_run(run.info.run_id).inputs.model_inputs] == [train.data.tags["model.id"]]
    assert run.data.params["graph.onnx_opset"] == "18"
    logged = {artifact.path for artifact in client.list_artifacts(run.info.run_id, "graph")}
    assert {"graph/model.onnx", "graph/model.pt2", "graph/model_graph.svg", "graph/summary.csv"} <= logged
    assert "summary.md" in {artifact.path for artifact in client.list_artifacts(run.info.run_id)}


@pytest.mark.slow
def test_profile_params_do_not_rerun_it_but_train_params_do(exported: Path, run_in: Any) -> None:
    params = read_params(exported)
    params["profile"]["batch_sizes"] = [1, 16, 32, 64]
    write_params(exported, params)
    status = json.loads(run_in(exported, "dvc", "status", "--json", "--with-deps", "export_graph").stdout)
    # The validate stage runs at every `dvc repro`; its output never changes, so nothing after it reruns.
    assert status == {"validate": [{"changed deps": {"params.yaml": "modified"}}, "always changed"]}
    params["train"]["seed"] = 2
    write_params(exported, params)
    status = json.loads(run_in(exported, "dvc", "status", "--json", "--with-deps", "export_graph").stdout)
    assert set(status) == {"validate", "train"}  # export_graph reruns once train has written the new checkpoint
