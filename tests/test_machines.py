"""Machines report: machine identity, grouping and ratios, and the report built from a real SQLite store
holding two machines' profile runs (the committed profiles and the H100 reference results)."""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipeline.common.errors import PipelineError
from pipeline.common.machine import (
    IDENTITY_KEYS,
    KERNEL_FEATURES,
    LABEL_VARIABLE,
    kernel_features,
    machine_fingerprint,
    machine_id,
    machine_name,
    short_cpu_name,
)
from pipeline.machines.report import MachinesReport, build_machines_report
from pipeline.machines.runs import LeftOut, Machine, ProfileRun, StepTime, read_store
from pipeline.params.schema import TrackingConfig
from pipeline.records.profile import Combination
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.tags import ID_TAG, NAME_TAG, identity_tags, machine_tags
from tests.helpers.projects import run_command, stage_environment
from tests.helpers.records import copy_profiles, gpu_run, gpu_run_file, log_profile_folder, profile_run_params
from tests.helpers.repo import GPU_RUN, REPO_ROOT
from tests.helpers.stores import empty_store

H100: dict[str, str] = json.loads((GPU_RUN / "hardware" / "fingerprint.json").read_text())  # the project's GPU run
LAPTOP = {
    **H100,
    "cpu": "11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz",
    "cpu_count": "8",
    "gpus": "none",
    "cpu_features": "avx2 fma",
    "cpu_family_model": "family 6, model 140",
}
MODEL = "a" * 64
OTHER_MODEL = "b" * 64
BIGGER_BUDGET = {"profile.time_budget_s": "30.0", "profile.ci_target_pct": "1.0"}


# --- machine identity ----------------------------------------------------------------------------


def test_identity_keys_are_the_fingerprint_keys() -> None:
    """Old runs' ids are recomputed from their `hardware.*` params: the keys must be the fingerprint's."""
    assert set(machine_fingerprint()) == set(IDENTITY_KEYS)


@pytest.mark.parametrize(
    ("model", "short"),
    [
        ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "Intel Xeon Platinum 8481C"),
        ("Intel(R) Xeon(R) Processor", "Intel Xeon"),
        ("AMD EPYC 7B13 64-Core Processor", "AMD EPYC 7B13"),
        ("11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", "11th Gen Intel Core i7-1165G7"),
        ("Apple M2", "Apple M2"),
        ("", "unknown CPU"),
    ],
)
def test_cpu_model_names_are_shortened(model: str, short: str) -> None:
    assert short_cpu_name(model) == short


def test_machine_names_say_gpu_cpu_and_cores_unless_labelled() -> None:
    assert machine_name(H100) == "NVIDIA H100 80GB HBM3 + Intel Xeon (16 vCPUs, AMX)"
    assert machine_name(LAPTOP) == "11th Gen Intel Core i7-1165G7 (8 vCPUs, AVX2)"
    assert machine_name({**H100, "gpus": "NVIDIA A100, NVIDIA A100"}).startswith("2x NVIDIA A100 + ")
    assert machine_name(LAPTOP, "alice-laptop") == "alice-laptop"


def test_fingerprint_tells_cpus_of_one_model_name_apart_and_ignores_the_kernel_build() -> None:
    """Two "AMD EPYC" VMs, one with AVX-512 BF16 (bf16 training) and one with AVX2 only (fp32): the features and
    the family/model come from /proc/cpuinfo, read here independently; the OS keeps no build suffix."""
    fingerprint = machine_fingerprint()
    info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    fields = dict((key.strip(), value.strip()) for key, _, value in (line.partition(":") for line in info.splitlines()))
    assert fingerprint["cpu_family_model"] == f"family {fields['cpu family']}, model {fields['model']}"
    flags = set(fields["flags"].split())
    assert set(fingerprint["cpu_features"].split()) == {f for f in KERNEL_FEATURES if f in flags} or (
        fingerprint["cpu_features"] == "none" and not flags & set(KERNEL_FEATURES)
    )
    assert "-" not in fingerprint["os"] and platform.release().startswith(fingerprint["os"].split()[1])
    zen4 = {**H100, "cpu": "AMD EPYC", "cpu_count": "2", "gpus": "none", "cpu_family_model": "family 25, model 17"}
    avx512 = {**zen4, "cpu_features": "avx2 fma avx512f avx512_vnni avx512_bf16"}
    avx2 = {**zen4, "cpu_features": "avx2 fma"}
    assert machine_id(avx512) != machine_id(avx2)
    assert machine_name(avx512) == "AMD EPYC (2 vCPUs, AVX-512 BF16)"
    assert machine_name(avx2) == "AMD EPYC (2 vCPUs, AVX2)"
    assert machine_name({**avx512, "cpu_features": "avx512f amx_tile"}) == "AMD EPYC (2 vCPUs, AMX)"
    assert kernel_features("fpu avx2 sse4_2 avx512f fma") == "avx2 fma avx512f" and kernel_features("fpu") == "none"


def test_the_gpu_runs_fingerprint_is_a_whole_fingerprint() -> None:
    assert set(H100) == set(IDENTITY_KEYS) and H100["gpus"].startswith("NVIDIA H100")


def test_machine_id_is_stable_and_follows_the_fingerprint() -> None:
    assert machine_id(H100) == machine_id(dict(H100))
    assert machine_id({**H100, "device_name": "cpu", "cuda_runtime": "13.0"}) == machine_id(H100)  # per-run extras
    assert machine_id({**H100, "torch": "2.15.0"}) != machine_id(H100)  # another environment: results differ
    assert machine_id(H100, "gpu-box") != machine_id(H100)  # labelled twins stay apart
    assert re.fullmatch(r"[0-9a-f]{12}", machine_id(H100))  # 12 hex digits: a folder name and a tag value


def test_label_comes_from_the_environment_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LABEL_VARIABLE, "  alice   laptop ")
    tags = machine_tags()
    assert tags == identity_tags(machine_fingerprint(), "alice laptop")
    assert tags[NAME_TAG] == "alice laptop"
    monkeypatch.setenv(LABEL_VARIABLE, "x" * 65)
    with pytest.raises(PipelineError, match=f"\\${LABEL_VARIABLE} is .*at most 64 characters"):
        machine_tags()
    monkeypatch.delenv(LABEL_VARIABLE)
    assert machine_tags()[NAME_TAG] == machine_name(machine_fingerprint())


def test_every_stage_run_is_tagged_with_its_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(LABEL_VARIABLE, raising=False)
    empty_store(tmp_path)
    with open_tracker("report", TrackingConfig("lab", "runs", "lab-model"), root=tmp_path) as tracker:
        run_id = tracker.run_id
    tags = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).data.tags
    assert tags[ID_TAG] == machine_id(machine_fingerprint())
    assert tags[NAME_TAG] == machine_name(machine_fingerprint())


def test_machines_sharing_a_store_have_their_own_pipeline_runs_and_current_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same commit and params on two machines: two pipeline runs, and one machine's rerun leaves the other's
    runs `current` (each machine has its own workspace)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    (tmp_path / "params.yaml").write_text("train: {lr: 1.0}\n")
    empty_store(tmp_path)
    run_ids: list[str] = []
    for label in ("alice", "bob", "alice"):
        monkeypatch.setenv(LABEL_VARIABLE, label)
        with open_tracker("report", TrackingConfig("lineage", "runs", "lab-model"), root=tmp_path) as tracker:
            run_ids.append(tracker.run_id)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    alice, bob, alice_again = (client.get_run(run_id).data.tags for run_id in run_ids)
    assert alice["mlflow.parentRunId"] == alice_again["mlflow.parentRunId"] != bob["mlflow.parentRunId"]
    assert [tags["dvc.outputs"] for tags in (alice, bob, alice_again)] == ["superseded", "current", "current"]
    assert client.get_run(bob["mlflow.parentRunId"]).data.tags[NAME_TAG] == "bob"


def test_loader_logs_the_params_the_profile_stage_logs() -> None:
    """tests/profile_runs.py stands in for the profile stage: the same param names, or the report test lies."""
    import torch

    from pipeline.profiling.run import ProfileSetup, run_description
    from pipeline.records.profile import ProfileSettings

    record = json.loads((gpu_run_file("16-cuda-train", "profile.json")).read_text())
    setup = ProfileSetup(
        combination=Combination(16, "cuda", "train"),
        device=torch.device("cpu"),
        step=lambda: None,
        hardware=record["hardware"],
        settings=ProfileSettings(
            **{"optimizer_lr": 1.0, "ci_target_pct": 2.0, "time_budget_s": 10.0, **record["settings"]}
        ),
        data_digest="d",
        flops_per_sample=1.0,
        model_digest=MODEL,
    )
    expected = {key: str(value) for key, value in run_description(setup, 10).params.items()}
    assert profile_run_params(record, 10, 1.0) == expected


# --- grouping and ratios, in memory --------------------------------------------------------------

SETTINGS = (("precision", "fp32"), ("profile.warmup_steps", "10"))


def make_run(
    machine: str,
    batch: int,
    step: StepTime,
    device: str = "cpu",
    mode: str = "inference",
    started: int = 1,
    model: str = MODEL,
    settings: tuple[tuple[str, str], ...] = SETTINGS,
) -> ProfileRun:
    return ProfileRun(
        run_id=f"{machine}-{batch}-{device}-{mode}-{started}-{model[0]}",
        started_ms=started,
        machine=Machine(f"id-{machine}", machine),
        combination=Combination(batch, device, mode),  # type: ignore[arg-type]
        device_name=device,
        model_digest=model,
        settings=settings,
        environment={"cpu": machine, "cpu_count": "2", "gpus": "none"},
        threads="2",
        step_time=step,
    )


def median(value: float, low: float, high: float) -> StepTime:
    return StepTime(value, "median", low, high)


def test_intervals_give_ratios_with_bounds_or_no_measurable_difference(tmp_path: Path) -> None:
    runs = [
        make_run("slow", 1, median(10.0, 9.0, 11.0)),
        make_run("slow", 64, median(64.0, 60.0, 68.0)),
        make_run("fast", 1, median(9.5, 8.8, 10.2)),  # overlaps slow's interval
        make_run("fast", 64, median(16.0, 15.0, 17.0)),
    ]
    report = build_machines_report(runs, [], "test store", tmp_path, baseline="slow")
    rows = {(row.machine, row.batch_size): row for row in report.rows}
    assert rows[("fast", 64)].per_sample_ms == 0.25
    assert (rows[("fast", 64)].per_sample_ms_ci_low, rows[("fast", 64)].per_sample_ms_ci_high) == (15 / 64, 17 / 64)
    assert rows[("fast", 64)].throughput_samples_per_s == 4000.0
    ratios = {ratio.batch_size: ratio for ratio in report.speedups}
    assert set(ratios) == {1, 64}
    assert all(ratio.machine == "fast" for ratio in ratios.values())
    assert ratios[64].value == 4.0
    assert ratios[64].interval is not None
    assert (ratios[64].interval.low, ratios[64].interval.high) == pytest.approx((60 / 17, 68 / 15))
    assert ratios[64].with_interval() == "4.00x (3.53-4.53x)"
    assert ratios[1].interval is not None
    assert not ratios[1].interval.measurable
    assert ratios[1].with_interval() == "1.05x; the data cannot tell them apart (0.88-1.25x)"
    assert "Per-sample speed-up over **slow · cpu**" in report.markdown
    assert "| inference | 64 | 4.00x (3.53-4.53x) |" in report.markdown
    assert "16 (15-17)" in report.markdown  # the step time with its interval
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(report.figures)


def test_noisy_busy_and_unbounded_rows_are_flagged(tmp_path: Path) -> None:
    runs = [
        make_run("a", 1, StepTime(5.0, "median", 0.0, 10.0, noisy=True, busy=True)),  # too few blocks: [0, 2x]
        make_run("b", 1, median(2.0, 1.9, 2.1)),
    ]
    report = build_machines_report(runs, [], "test store", tmp_path, baseline="b")
    assert "| median, 95 % CI ⚠ noisy ⚠ busy | 5 (unbounded) | 5 (unbounded) | 200 |" in report.markdown
    assert "⚠ busy: the load average exceeded the cores" in report.markdown
    (ratio,) = report.speedups
    assert ratio.with_interval() == "the data cannot tell them apart (too few timed blocks to bound the ratio)"


def test_means_compare_without_bounds_and_never_with_medians(tmp_path: Path) -> None:
    runs = [
        make_run("old", 16, StepTime(8.0, "mean", cv=0.2)),
        make_run("new", 16, StepTime(4.0, "mean", cv=0.1)),
        make_run("new", 16, median(4.0, 3.8, 4.2), started=2),  # a newer estimate: its own group
    ]
    report = build_machines_report(runs, [], "test store", tmp_path, baseline="old")
    (ratio,) = report.speedups
    assert (ratio.value, ratio.interval, ratio.with_interval()) == (2.0, None, "2.00x †")
    assert "8 (CV 20.0%)" in report.markdown
    assert "† no confidence interval" in report.markdown
    assert [(row.group, row.statistic) for row in report.rows] == [(1, "mean"), (1, "mean"), (2, "median")]
    assert "step time: median of timed blocks with its 95 % CI vs mean of timed steps (older runs)" in report.markdown


def test_latest_run_per_machine_and_combination_and_unlike_runs_apart(tmp_path: Path) -> None:
    runs = [
        make_run("a", 1, StepTime(5.0, "mean"), started=1),
        make_run("a", 1, StepTime(4.0, "mean"), started=2),  # newer: replaces the one above
        make_run("b", 1, StepTime(2.0, "mean"), started=1),
        make_run("b", 1, StepTime(1.0, "mean"), started=3, model=OTHER_MODEL),
        make_run("a", 1, StepTime(3.0, "mean"), started=3, settings=(("precision", "bf16"), *SETTINGS[1:])),
    ]
    report = build_machines_report(runs, [LeftOut("x", "no `model.digest` tag")], "test store", tmp_path)
    first = [(row.machine, row.step_time_ms) for row in report.rows if row.group == 1]
    assert first == [("a", 4.0), ("b", 2.0)]
    assert sorted((row.group, row.machine) for row in report.rows if row.group > 1) == [(2, "b"), (3, "a")]
    assert "(1 older ones superseded)" in report.markdown
    assert "## Not comparable" in report.markdown
    assert "another checkpoint (`model.digest` bbbbbbbbbbbb vs aaaaaaaaaaaa)" in report.markdown
    assert "`precision` bf16 vs fp32" in report.markdown
    assert "## Runs left out\n\n- 1 run(s): no `model.digest` tag." in report.markdown


def test_baseline_is_this_machine_by_default_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    runs = [make_run(name, 1, StepTime(value, "mean")) for name, value in (("a", 2.0), ("b", 1.0), ("c", 4.0))]
    report = build_machines_report(runs, [], "test store", tmp_path, this_machine="id-c")
    assert "speed-up over **c · cpu**" in report.markdown
    assert {ratio.machine: ratio.value for ratio in report.speedups} == {"a": 2.0, "b": 4.0}
    with pytest.raises(
        PipelineError, match="--baseline 'z' matches no machine in test store; the machines are: a, b, c"
    ):
        build_machines_report(runs, [], "test store", tmp_path, baseline="z")


def test_no_usable_run_is_an_error_naming_the_reasons(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"No usable profile run in s3 \(2 with no `model.digest` tag\).*README"):
        build_machines_report([], [LeftOut("x", "no `model.digest` tag")] * 2, "s3", tmp_path)


# --- a real SQLite store with two machines' runs -------------------------------------------------


@pytest.fixture(scope="module")
def lab_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A project folder whose mlflow.db holds the committed profiles (machine A) and the H100 results
    (machine B) as runs of one checkpoint, plus runs the report must set apart or leave out."""
    project = tmp_path_factory.mktemp("lab")
    shutil.copy(REPO_ROOT / "params.yaml", project / "params.yaml")
    uri = empty_store(project)
    client = MlflowClient(uri)
    experiment = client.create_experiment("mnist-lab")
    here = copy_profiles(REPO_ROOT / "profiles", project / "import" / "workspace")
    h100 = copy_profiles(gpu_run() / "profiles", project / "import" / "h100")
    one_combination = project / "import" / "one"
    shutil.copytree(here / "64-cpu-train", one_combination / "64-cpu-train")
    now = int(time.time() * 1000)
    older = log_profile_folder(client, experiment, one_combination, MODEL, started_ms=now - 60_000)
    runs = {
        "here": log_profile_folder(client, experiment, here, MODEL, started_ms=now - 30_000),
        # Logged in the earlier format (`hardware.*` params, metrics without the `profile/` prefix):
        # a shared store holds both kinds, and the report reads both.
        "h100": log_profile_folder(client, experiment, h100, MODEL, started_ms=now - 20_000, legacy=True),
    }
    # Newer, with a larger time budget: how long to measure is no reason to set a run apart, so it replaces one.
    runs["here"].update(
        log_profile_folder(
            client, experiment, one_combination, MODEL, started_ms=now - 10_000, settings_override=BIGGER_BUDGET
        )
    )
    failed = log_profile_folder(client, experiment, one_combination, MODEL, started_ms=now, status="FAILED")
    other_model = log_profile_folder(client, experiment, one_combination, OTHER_MODEL, started_ms=now)
    other_layout = log_profile_folder(
        client,
        experiment,
        one_combination,
        MODEL,
        started_ms=now,
        settings_override={"memory_format": "contiguous_format"},
    )
    legacy = project / "import" / "legacy"
    shutil.copytree(h100 / "1-cpu-inference", legacy / "1-cpu-inference")
    # As runs before the median estimate logged it: the mean of the timed steps and their CV, no median.
    record_path = legacy / "1-cpu-inference" / "profile.json"
    raw = json.loads(record_path.read_text())
    timing = raw["timing"]
    raw["timing"] = {
        "step_time_ms_mean": timing["step_time_ms_median"],
        "step_time_cv": 0.05,
        "peak_memory_mb": timing["peak_memory_mb"],
        "top_operator_share_pct": timing["top_operator_share_pct"],
    }
    record_path.write_text(json.dumps(raw))
    mean_timed = log_profile_folder(client, experiment, legacy, MODEL, started_ms=now, retime=False, legacy=True)
    no_digest = client.create_run(experiment, tags={"stage": "profile"}).info.run_id
    client.log_batch(no_digest, params=[])
    client.set_terminated(no_digest, "FINISHED")
    return {
        "project": project,
        "uri": uri,
        "client": client,
        "runs": runs,
        "set_apart": {
            "older": older,
            "failed": failed,
            "other_model": other_model,
            "other_layout": other_layout,
            "mean_timed": mean_timed,
        },
    }


@pytest.fixture(scope="module")
def store_report(lab_store: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> MachinesReport:
    runs, left_out = read_store(lab_store["uri"], "mnist-lab")
    return build_machines_report(runs, left_out, "the test store", tmp_path_factory.mktemp("figures"))


@pytest.mark.slow  # an MLflow store of two machines built in process: seconds
def test_report_rows_are_the_latest_runs_and_match_their_metrics(
    lab_store: dict[str, Any], store_report: MachinesReport
) -> None:
    client: MlflowClient = lab_store["client"]
    expected_ids = {run_id for machine in lab_store["runs"].values() for run_id in machine.values()}
    first_group = [row for row in store_report.rows if row.group == 1]
    assert {row.run_id for row in first_group} == expected_ids  # 6 here + 12 on the H100, nothing older or failed
    assert len({row.machine_id for row in first_group}) == 2
    for row in first_group:
        run = client.get_run(row.run_id)
        params = run.data.params
        # This machine's runs name their metrics `profile/...`; the H100's are logged the older way, without.
        metrics = {key.removeprefix("profile/"): value for key, value in run.data.metrics.items()}
        assert row.machine_id == run.data.tags[ID_TAG]
        assert row.machine == run.data.tags[NAME_TAG]
        assert (row.batch_size, row.device, row.mode) == (int(params["batch_size"]), params["device"], params["mode"])
        assert row.statistic == "median"
        assert row.step_time_ms == metrics["step_time_ms_median"]
        assert (row.step_time_ms_ci_low, row.step_time_ms_ci_high) == (
            metrics["step_time_ms_ci_low"],
            metrics["step_time_ms_ci_high"],
        )
        assert row.per_sample_ms == pytest.approx(metrics["per_sample_ms"], rel=1e-12)
        assert row.throughput_samples_per_s == pytest.approx(metrics["throughput_samples_per_s"], rel=1e-12)
        assert row.model_digest == MODEL
    h100_row = next(
        r
        for r in first_group
        if r.machine.startswith("NVIDIA H100") and r.batch_size == 64 and r.device == "cuda" and r.mode == "train"
    )
    timing = json.loads((gpu_run_file("64-cuda-train", "profile.json")).read_text())["timing"]
    assert h100_row.per_sample_ms == pytest.approx(timing["step_time_ms_median"] / 64)  # the record's median
    assert h100_row.step_time_ms_ci_low < h100_row.step_time_ms < h100_row.step_time_ms_ci_high
    assert h100_row.device_name == "NVIDIA H100 80GB HBM3"


@pytest.mark.slow  # an MLflow store of two machines built in process: seconds
def test_ratios_compare_every_other_machine_and_device_with_the_baseline(store_report: MachinesReport) -> None:
    rows = {(r.machine, r.device, r.mode, r.batch_size): r for r in store_report.rows if r.group == 1}
    ratios = [ratio for ratio in store_report.speedups if ratio.group == 1]
    baseline_platform = {(r.machine, r.device) for r in rows.values()} - {(r.machine, r.device) for r in ratios}
    ((base_machine, base_device),) = baseline_platform
    assert base_device == "cpu"
    assert len(ratios) == len(rows) - 6  # every other row has the baseline's combination
    for ratio in ratios:
        base = rows[(base_machine, base_device, ratio.mode, ratio.batch_size)]
        other = rows[(ratio.machine, ratio.device, ratio.mode, ratio.batch_size)]
        assert ratio.value == pytest.approx(base.per_sample_ms / other.per_sample_ms)
        assert ratio.interval is not None
        assert ratio.interval.low == pytest.approx(base.step_time_ms_ci_low / other.step_time_ms_ci_high)
        assert ratio.interval.high == pytest.approx(base.step_time_ms_ci_high / other.step_time_ms_ci_low)
        assert f"| {ratio.mode} | {ratio.batch_size} |" in store_report.markdown
        assert ratio.with_interval() in store_report.markdown


@pytest.mark.slow  # an MLflow store of two machines built in process: seconds
def test_unlike_runs_are_reported_apart_and_named(lab_store: dict[str, Any], store_report: MachinesReport) -> None:
    set_apart = lab_store["set_apart"]
    by_run = {row.run_id: row for row in store_report.rows}
    assert by_run[set_apart["other_model"]["64-cpu-train"]].group > 1
    assert by_run[set_apart["other_layout"]["64-cpu-train"]].group > 1
    assert by_run[set_apart["mean_timed"]["1-cpu-inference"]].statistic == "mean"
    assert by_run[set_apart["mean_timed"]["1-cpu-inference"]].group > 1
    assert set_apart["older"]["64-cpu-train"] not in by_run
    assert set_apart["failed"]["64-cpu-train"] not in by_run
    markdown = store_report.markdown
    assert "another checkpoint (`model.digest` bbbbbbbbbbbb vs aaaaaaaaaaaa)" in markdown
    assert "`memory_format` contiguous_format vs channels_last" in markdown
    assert "step time: mean of timed steps (older runs) vs median of timed blocks with its 95 % CI" in markdown
    assert "- 1 run(s): no `batch_size`, `device`, `mode` param(s)." in markdown
    assert "(2 older ones superseded)" in markdown  # the oldest run and the one the bigger budget replaced
    assert "| NVIDIA H100 80GB HBM3 + Intel Xeon (16 vCPUs, AMX) | `" in markdown  # its environment row


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_command_writes_the_report_from_the_project_store(lab_store: dict[str, Any], mnist_mirror: Path) -> None:
    """`python -m pipeline.machines` in a project folder, no $MLFLOW_TRACKING_URI: the project's mlflow.db."""
    project: Path = lab_store["project"]
    result = run_command(
        [sys.executable, "-m", "pipeline.machines", "--output", "out"],
        project,
        {**stage_environment(mnist_mirror), "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 machine(s)" in result.stdout
    markdown = (project / "out" / "machines.md").read_text()
    assert f"from `sqlite:///{project / 'mlflow.db'}` (experiment `mnist-lab`)" in markdown
    html = (project / "out" / "machines.html").read_text()
    assert html.count('src="data:image/png;base64,') == markdown.count("](figures/")
    assert 'src="figures/' not in html
    rows = list(csv.DictReader((project / "out" / "machines.csv").read_text().splitlines()))
    expected = {run_id for machine in lab_store["runs"].values() for run_id in machine.values()}
    assert {row["run_id"] for row in rows if row["group"] == "1"} == expected
    assert sorted(path.name for path in (project / "out" / "figures").iterdir()) == sorted(
        name.split("](figures/")[1].split(")")[0] for name in markdown.splitlines() if "](figures/" in name
    )


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_command_without_a_store_says_how_to_get_one(tmp_path: Path, mnist_mirror: Path) -> None:
    shutil.copy(REPO_ROOT / "params.yaml", tmp_path / "params.yaml")
    environment = {**stage_environment(mnist_mirror), "PYTHONPATH": str(REPO_ROOT)}
    result = run_command([sys.executable, "-m", "pipeline.machines"], tmp_path, environment)
    assert result.returncode == 2
    assert f"No MLflow store at {tmp_path / 'mlflow.db'}: run `dvc repro` here first" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "mlflow.db").exists()
    assert os.listdir(tmp_path) == ["params.yaml"]
