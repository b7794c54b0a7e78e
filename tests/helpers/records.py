"""Profile records for the tests: made in memory (make_record), or read from a folder of results and logged
as MLflow profile runs (log_profile_folder).

Logging a folder of profile results (`profiles/<batch>-<device>-<mode>/profile.json`) as MLflow profile runs.

For the machines-report tests: results measured on another machine (the project's H100 run in
tests/data/gpu/) become runs like the ones its profile stage would have logged to a shared
server, with that machine's `hardware.*` params and `machine.*` tags. Reads raw JSON, so records written
before the current record type load too. Such an older record holds the per-step times of its timed pass
but only their mean: by default its steps are re-estimated the way the profile stage estimates now
(pipeline.records.statistics: median with its 95 % interval, each step a block of one), so it compares
with current runs; `retime=False` logs its mean and CV as an older run did.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from pipeline.common.machine import IDENTITY_KEYS
from pipeline.records import profile as profile_record
from pipeline.records.quantities import GOVERNOR_NOT_EXPOSED, MeasurementConditions, StepAnatomy
from pipeline.records.statistics import Block, estimate_step_time
from pipeline.tracking.tags import identity_tags
from tests.helpers.repo import GPU_RUN, REPO_PARAMS


def make_record(
    batch: int,
    device: str,
    mode: str,
    step_ms: float,
    operators: tuple[tuple[str, float], ...] = (),
    ci_pct: float = 2.0,
    load: float = 0.5,
    busy_pct: float = 90.0,
) -> profile_record.ProfileRecord:
    """A profile record for report tests: the given median step time, its 95 % CI half-width (%) from 6 timing
    processes (their medians not listed), the load average while timing (2 cores), (operator, share %) rows and
    busy share.

    Its step analysis: a traced step twice the timed one, 1 MFLOP per sample, a 100 GFLOP/s peak."""
    combination = profile_record.Combination(batch, device, mode)  # type: ignore[arg-type]
    device_ms = None if device == "cpu" else 0.0  # no GPU traced: no number
    rows = tuple(
        profile_record.OperatorRow(name, 1.0, 0.1, 0.1, device_ms, device_ms, share, None) for name, share in operators
    )
    timing = profile_record.Timing(
        step_time_ms_median=step_ms,
        step_time_ms_iqr=step_ms * 0.1,
        step_time_ms_ci_low=step_ms * (1 - ci_pct / 100),
        step_time_ms_ci_high=step_ms * (1 + ci_pct / 100),
        step_time_ci_pct=ci_pct,
        steps_measured=400,
        blocks_measured=100,
        steps_per_block=4,
        per_sample_ms=step_ms / batch,
        throughput_samples_per_s=1000 * batch / step_ms,
        noisy=ci_pct > 2.0,
        timing_s=3.0,
        peak_memory_mb=10.0,
        top_operator_share_pct=rows[0].share_pct if rows else 0.0,
    )
    settings = profile_record.ProfileSettings(
        2, profile_record.PROFILE_PRECISION, "channels_last", 3, 8, 1.0, 2.0, 10.0, processes=6
    )
    conditions = MeasurementConditions(load, load, cores=2, threads=2, cpu_governor=GOVERNOR_NOT_EXPOSED)
    hardware = {"cpu": "Test CPU", "cpu_count": "2", "gpus": "none", "torch": "2.x"}
    verdict = "host-bound" if busy_pct < 50 else "device-bound"
    anatomy = StepAnatomy(
        device, 8, 2 * step_ms, 2 * step_ms * busy_pct / 100, busy_pct, 100 - busy_pct, 0, 0, 0, verdict, ""
    )
    analysis = profile_record.StepAnalysis(
        anatomy, profile_record.flop_rate(1e6, batch, step_ms, 100.0), "a 100 GFLOP/s stand-in", (), (), 0.0
    )
    return profile_record.ProfileRecord(
        combination, hardware, settings, timing, conditions, (step_ms,) * 100, rows, "abc123", analysis
    )


def make_comparisons(
    device: str, ratios: dict[tuple[str, str], tuple[float, float, float, tuple[float, ...]]]
) -> profile_record.DeviceComparisons:
    """A device's paired comparisons: (numerator, denominator) -> (value, low, high, each process's value); per
    sample where the two names' modes agree, per step otherwise."""
    return profile_record.DeviceComparisons(
        device=device,
        processes=max((len(found[3]) for found in ratios.values()), default=0),
        comparisons=tuple(
            profile_record.PairedComparison(
                numerator, denominator, "sample" if numerator.split("-")[2] == denominator.split("-")[2] else "step",
                value, low, high, processes,
            )
            for (numerator, denominator), (value, low, high, processes) in ratios.items()
        ),
    )  # fmt: skip


def write_two_profiles() -> None:
    """Profile records and tables of batch 1 and 64 (cpu, inference) and their paired comparison in the current
    folder, as the profile stage writes them: the report's inputs without running the pipeline."""
    from pipeline.common.paths import DeviceProfileOutputs
    from pipeline.records.profile import write_comparisons, write_record
    from pipeline.records.wording import operators_markdown

    for record in (
        make_record(1, "cpu", "inference", 0.5, (("aten::mkldnn_convolution", 40.0),)),
        make_record(64, "cpu", "inference", 8.0, (("aten::max_pool2d", 30.0),)),
    ):
        paths = record.combination.outputs
        paths.folder.mkdir(parents=True)
        paths.record.write_text(write_record(record))
        paths.table_markdown.write_text(operators_markdown(record))
    ratio = make_comparisons("cpu", {("64-cpu-inference", "1-cpu-inference"): (0.25, 0.24, 0.26, (0.25,) * 6)})
    DeviceProfileOutputs("cpu").comparisons.write_text(write_comparisons(ratio))


def gpu_run() -> Path:
    """The project's H100 run (tests/data/gpu/h100-2026-11-27), in the pipeline's own layout: hardware/, metrics/,
    profiles/<device>/<batch>-<mode>/, traces/cuda/."""
    records = list(GPU_RUN.glob("profiles/*/*/profile.json"))
    if not (GPU_RUN / "hardware" / "fingerprint.json").is_file() or len(records) != 12:
        pytest.fail(f"the GPU run (hardware/fingerprint.json, 12 profiles/*/*/profile.json) is incomplete at {GPU_RUN}")
    return GPU_RUN


def gpu_run_file(name: str, file: str) -> Path:
    """A file of combination `name` (`16-cuda-train`) in the GPU run's profile folder."""
    batch, device, mode = name.split("-")
    return gpu_run() / "profiles" / device / f"{batch}-{mode}" / file


def copy_profiles(source: Path, target: Path) -> Path:
    """The JSON files of `source`'s profile folders copied under `target`, one `<batch>-<device>-<mode>` folder per
    combination (never write to the shared copy). `source` holds either that layout (the reference runs) or the
    profile stage's `<device>/<batch>-<mode>/`."""
    for path in sorted([*source.glob("*/*.json"), *source.glob("*/*/*.json")]):
        if path.parent.parent == source:
            name = path.parent.name
        elif path.parent.parent.parent == source:
            batch, mode = path.parent.name.split("-")
            name = f"{batch}-{path.parent.parent.name}-{mode}"
        else:
            continue
        if path.parent.parent == source and path.parent.name in {"cpu", "cuda", "mps"}:
            continue  # a device's own files (comparisons.json), not a combination's
        destination = target / name / path.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
    return target


def profile_run_params(record: dict[str, Any], top_k: int, optimizer_lr: float) -> dict[str, str]:
    """The params the profile stage logs (pipeline.records.profile.run_params) for a profile.json record;
    settings an older record lacks: `optimizer_lr` as given, the timing targets from params.yaml."""
    targets = ("ci_target_pct", "time_budget_s")
    given = {key: float(record["settings"].get(key, REPO_PARAMS["profile"][key])) for key in targets}
    settings = profile_record.ProfileSettings(**{"optimizer_lr": optimizer_lr, **record["settings"], **given})
    combination = profile_record.Combination(**record["combination"])
    return {key: str(value) for key, value in profile_record.run_params(combination, settings, top_k).items()}


def record_metrics(record: dict[str, Any], retime: bool = True) -> dict[str, float]:
    """The timing metrics of a record; an older record's steps re-estimated as the stage does now (`retime`)."""
    timing = {key: float(value) for key, value in record["timing"].items()}
    if "step_time_ms_median" in timing or not retime:
        return timing
    steps = record["step_times_ms"]
    target = float(record["settings"].get("ci_target_pct", REPO_PARAMS["profile"]["ci_target_pct"]))
    estimate = estimate_step_time([Block(1, ms / 1000) for ms in steps], record["combination"]["batch_size"], target)
    kept = ("peak_memory_mb", "top_operator_share_pct")
    rest = {key: timing[key] for key in kept}
    metrics = profile_record.Timing.from_estimate(
        estimate, steps_per_block=1, timing_s=timing.get("timing_s", 0.0), **rest
    ).as_metrics()
    if "timing_s" not in timing:
        del metrics["timing_s"]  # such a record never had it
    return metrics


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
        fingerprint = {key: record["hardware"].get(key, "") for key in IDENTITY_KEYS}  # older records: fewer keys
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
