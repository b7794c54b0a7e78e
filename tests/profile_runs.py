"""Log a folder of profile results (`profiles/<batch>-<device>-<mode>/profile.json`) as MLflow profile runs.

For the machines-report tests: results measured on another machine (the H100 reference in
../shared/gpu-reference) become runs like the ones its profile stage would have logged to a shared
server, with that machine's `hardware.*` params and `machine.*` tags. Reads raw JSON, so records written
before the current record type load too. Such an older record holds the per-step times of its timed pass
but only their mean: by default its steps are re-estimated the way the profile stage estimates now
(pipeline.profiling.statistics: median with its 95 % interval, each step a block of one), so it compares
with current runs; `retime=False` logs its mean and CV as an older run did.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from pipeline.common.machine import IDENTITY_KEYS
from pipeline.profiling.statistics import Block, estimate_step_time
from pipeline.tracking.tags import identity_tags
from tests.helpers import REPO_PARAMS, REPO_ROOT


def gpu_reference() -> Path:
    """The H100 reference run: `../shared/gpu-reference/h100-2026-11-22`, or $GPU_REFERENCE."""
    path = Path(os.environ.get("GPU_REFERENCE") or REPO_ROOT.parent / "shared" / "gpu-reference" / "h100-2026-11-22")
    if not (path / "fingerprint.json").is_file() or len(list(path.glob("profiles/*/profile.json"))) != 12:
        pytest.fail(
            f"GPU reference run (fingerprint.json, 12 profiles/*/profile.json) not found at {path}; set GPU_REFERENCE"
        )
    return path


def copy_profiles(source: Path, target: Path) -> Path:
    """The JSON files of `source`'s profile folders copied under `target` (never write to the shared copy)."""
    for path in sorted(source.glob("*/*.json")):
        destination = target / path.parent.name / path.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
    return target


def profile_run_params(record: dict[str, Any], top_k: int, optimizer_lr: float) -> dict[str, str]:
    """The params `pipeline.profiling.run_parameters` logs, rebuilt from a profile.json record (settings an
    older record lacks: `optimizer_lr` as given, the timing targets from params.yaml)."""
    settings = record["settings"]
    return {
        **{key: str(value) for key, value in record["combination"].items()},
        "threads": str(settings["threads"]),
        "precision": settings["precision"],
        "memory_format": settings["memory_format"],
        "optimizer_lr": str(settings.get("optimizer_lr", optimizer_lr)),
        "profile.warmup_steps": str(settings["warmup_steps"]),
        "profile.active_steps": str(settings["active_steps"]),
        "profile.ci_target_pct": str(float(settings.get("ci_target_pct", REPO_PARAMS["profile"]["ci_target_pct"]))),
        "profile.time_budget_s": str(float(settings.get("time_budget_s", REPO_PARAMS["profile"]["time_budget_s"]))),
        "profile.top_k": str(top_k),
    }


def record_metrics(record: dict[str, Any], retime: bool = True) -> dict[str, float]:
    """The timing metrics of a record; an older record's steps re-estimated as the stage does now (`retime`)."""
    timing = {key: float(value) for key, value in record["timing"].items()}
    if "step_time_ms_median" in timing or not retime:
        return timing
    steps = record["step_times_ms"]
    target = float(record["settings"].get("ci_target_pct", REPO_PARAMS["profile"]["ci_target_pct"]))
    estimate = estimate_step_time([Block(1, ms / 1000) for ms in steps], record["combination"]["batch_size"], target)
    kept = ("peak_memory_mb", "top_operator_share_pct")
    return {**estimate.metrics(), "steps_per_block": 1.0, **{key: timing[key] for key in kept}}


def log_profile_folder(
    client: MlflowClient,
    experiment_id: str,
    folder: Path,
    model_digest: str,
    *,
    label: str | None = None,
    started_ms: int | None = None,
    optimizer_lr: float = 1.0,  # train.lr of the checkpoint; records before the typed record lack it
    retime: bool = True,
    settings_override: dict[str, str] | None = None,
    status: str = "FINISHED",
    legacy: bool = False,
) -> dict[str, str]:
    """One profile run per `folder/*/profile.json`, logged as the stage logs it (`hardware.*` tags, `profile/`
    metrics), or with `legacy` as runs before 2026-11-23 were (`hardware.*` params, bare metric names);
    returns combination name -> run id."""
    started_ms = started_ms or int(time.time() * 1000)
    run_ids = {}
    for path in sorted(folder.glob("*/profile.json")):
        record = json.loads(path.read_text())
        combination = record["combination"]
        name = f"{combination['batch_size']}-{combination['device']}-{combination['mode']}"
        fingerprint = {key: record["hardware"][key] for key in IDENTITY_KEYS}
        tags = {
            "stage": "profile",
            "combination": name,
            "model.digest": model_digest,
            "data.digest": record.get("data_digest", ""),
            **identity_tags(fingerprint, label),
        }
        run = client.create_run(experiment_id, start_time=started_ms, tags=tags, run_name=f"profile@{name}")
        params = {**profile_run_params(record, len(record["top_operators"]), optimizer_lr), **(settings_override or {})}
        hardware = {f"hardware.{key}": value for key, value in record["hardware"].items()}
        if legacy:
            params |= hardware
        else:
            tags |= hardware
        prefix = "" if legacy else "profile/"
        metrics = {prefix + key: value for key, value in record_metrics(record, retime).items()}
        series_name = prefix + ("block_step_time_ms" if "block_times_ms" in record else "step_time_ms")
        series = record.get("block_times_ms", record.get("step_times_ms", []))
        client.log_batch(
            run.info.run_id,
            metrics=[Metric(key, value, started_ms, 0) for key, value in metrics.items()]
            + [Metric(series_name, value, started_ms, step) for step, value in enumerate(series)],
            params=[Param(key, value) for key, value in params.items()],
            tags=[RunTag(key, value) for key, value in tags.items()],
        )
        client.set_terminated(run.info.run_id, status, end_time=started_ms + 1000)
        run_ids[name] = run.info.run_id
    return run_ids
