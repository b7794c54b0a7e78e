"""Runs that end before their stage's outputs are committed (the profile stage's, one per combination) become the
workspace's current ones only once the outputs are in place; a stop before that leaves the older ones current."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.params.schema import TrackingConfig
from pipeline.tracking.lifecycle import open_tracker, settled_after_commit
from pipeline.tracking.tags import OUTPUTS_TAG
from tests.helpers.stores import empty_store

pytestmark = pytest.mark.slow  # MLflow's import and store: seconds


def _profile_runs(root: Path, stop: bool) -> list[str]:
    """Two combinations' runs ended inside `settled_after_commit`, the stage stopped after them where `stop`."""
    ids = []
    config = TrackingConfig("settle", "runs", "lab-model")
    expected = pytest.raises(KeyboardInterrupt) if stop else contextlib.nullcontext()
    with expected, settled_after_commit() as ended:
        for variant in ("1-cpu-inference", "16-cpu-inference"):
            with open_tracker("profile", config, variant=variant, root=root, current=False) as tracker:
                ids.append(tracker.run_id)
            ended.append((tracker, f"profile@{variant}"))
        if stop:
            raise KeyboardInterrupt
    return ids


def test_profile_runs_become_current_only_once_their_outputs_are_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    empty_store(tmp_path)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = _profile_runs(tmp_path, stop=False)
    assert [client.get_run(run_id).data.tags[OUTPUTS_TAG] for run_id in first] == ["current", "current"]
    stopped = _profile_runs(tmp_path, stop=True)
    assert [client.get_run(run_id).info.status for run_id in stopped] == ["KILLED", "KILLED"]
    assert [client.get_run(run_id).data.tags.get(OUTPUTS_TAG) for run_id in stopped] == [None, None]
    assert [client.get_run(run_id).data.tags[OUTPUTS_TAG] for run_id in first] == ["current", "current"]
    again = _profile_runs(tmp_path, stop=False)
    assert [client.get_run(run_id).data.tags[OUTPUTS_TAG] for run_id in first] == ["superseded", "superseded"]
    assert [client.get_run(run_id).data.tags[OUTPUTS_TAG] for run_id in again] == ["current", "current"]
