"""params.yaml validation: the repository's file parses; each kind of bad value is named clearly."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.common.errors import PipelineError
from pipeline.params.loading import load_params
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import Params, section_as_dict
from tests.helpers.projects import write_params
from tests.helpers.repo import REPO_ROOT


def test_repository_params_parse_into_typed_frozen_sections() -> None:
    params = load_params(REPO_ROOT / "params.yaml")
    assert isinstance(params, Params)
    assert params.train.batch_size == 64 and isinstance(params.train.lr, float)
    assert params.profile.batch_sizes == (1, 16, 64)
    assert params.train.model.hidden_units == 128
    assert params.train.execution == "auto"
    with pytest.raises(AttributeError):
        params.train.lr = 2.0  # type: ignore[misc]
    assert section_as_dict(params.train)["model.conv1_channels"] == 32


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for parent in parents:
        raw = raw[parent]
    raw[leaf] = value


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("train.batch_size", 0, "`train.batch_size` = 0 is not allowed; it must be >= 1"),
        ("train.lr", -0.5, "`train.lr` = -0.5 is not allowed; it must be > 0"),
        (
            "train.device",
            "tpu",
            "`train.device` = 'tpu' is not allowed; it must be one of 'auto', 'cpu', 'cuda', 'mps'",
        ),
        (
            "train.execution",
            "graph",
            "`train.execution` = 'graph' is not allowed; choose one of 'auto', 'eager', 'cuda_graph'",
        ),
        ("profile.batch_sizes", [], "`profile.batch_sizes` is an empty list"),
        ("profile.batch_sizes", [1, 0], "`profile.batch_sizes[1]` = 0 is not allowed; it must be >= 1"),
        ("profile.batch_sizes", [16, 16], "`profile.batch_sizes` = [16, 16] repeats a value"),
        ("profile.devices", ["cpu", "tpu"], "`profile.devices[1]` = 'tpu' is not allowed"),
        ("profile.ci_target_pct", 0, "`profile.ci_target_pct` = 0 is not allowed; it must be > 0 and <= 50"),
        ("profile.time_budget_s", "10s", "`profile.time_budget_s` = '10s' has the wrong type; expected a number"),
        ("train.epochs", "two", "`train.epochs` = 'two' has the wrong type; expected an integer"),
        ("train.epochs", 1.5, "`train.epochs` = 1.5 has the wrong type; expected an integer"),
        ("train.seed", True, "`train.seed` = True has the wrong type"),
        ("train.gamma", 1.5, "`train.gamma` = 1.5 is not allowed; it must be > 0 and <= 1"),
        ("data.mirrors", ["ftp://example.org/mnist"], "`data.mirrors[0]` = 'ftp://example.org/mnist' is not allowed"),
        ("data.mirrors", "https://example.org/", "`data.mirrors` = 'https://example.org/' has the wrong type"),
        ("tracking.experiment", " ", "`tracking.experiment` = ' ' is not allowed; it must be a non-empty string"),
        ("train.model", 3, "`train.model` must be a mapping"),
    ],
)
def test_bad_value_is_named_with_what_is_allowed(
    repo_params: dict[str, Any], key: str, value: Any, expected: str
) -> None:
    _set(repo_params, key, value)
    with pytest.raises(PipelineError) as caught:
        params_from_mapping(repo_params)
    assert expected in str(caught.value)
    assert "params.yaml" in str(caught.value)


def test_unknown_and_missing_keys_are_both_reported(repo_params: dict[str, Any]) -> None:
    repo_params["train"]["learning_rate"] = 0.1
    del repo_params["train"]["lr"]
    repo_params["optimizer"] = {}
    with pytest.raises(PipelineError) as caught:
        params_from_mapping(repo_params)
    message = str(caught.value)
    assert "`train.learning_rate` is not a known key (allowed in `train`: device, precision, threads" in message
    assert "`train.lr` is missing" in message
    assert "`optimizer` is not a known key" in message
    assert "3 invalid value(s)" in message


def test_invalid_yaml_and_missing_file_are_user_errors(tmp_path: Path) -> None:
    broken = tmp_path / "params.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(PipelineError, match="is not valid YAML"):
        load_params(broken)
    with pytest.raises(PipelineError, match=r"not found\. Run the stage from the project root"):
        load_params(tmp_path / "absent.yaml")


def test_stage_with_bad_params_exits_with_message_and_no_traceback(
    project_copy: Path, repo_params: dict[str, Any], run_in: Any
) -> None:
    repo_params["train"]["batch_size"] = 0
    write_params(project_copy, repo_params)
    result: subprocess.CompletedProcess[str] = run_in(project_copy, "python", "-m", "stages.download")
    assert result.returncode == 2
    assert "`train.batch_size` = 0 is not allowed; it must be >= 1" in result.stderr
    assert "Traceback" not in result.stderr
    # Validation happens before any work: no data and no tracking store were created.
    assert not (project_copy / "data" / "MNIST").exists()
    assert not (project_copy / "mlflow.db").exists()
