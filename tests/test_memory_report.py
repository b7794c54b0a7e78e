"""The report's "Memory and energy per step" and the profile's memory.md: each row and sentence from the records'
numbers, energy said once per device where there is none, and a figure whose texts name the parts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PIL import Image

from pipeline.common.tables import NO_NUMBER
from pipeline.machines.compare import MachineRow
from pipeline.machines.report import rows_markdown
from pipeline.profiling.processes import energy_over_processes
from pipeline.records.profile import ProfileRecord
from pipeline.records.quantities import MEMORY_PARTS, MemoryPart, StepEnergy, StepMemory
from pipeline.records.wording import memory_markdown
from pipeline.report.catalogue import load_catalogue
from pipeline.report.findings import AnalysisData, memory_by_batch
from pipeline.report.memory import memory_section
from tests.helpers.records import make_record

MB = 1_000_000


def memory(parts: dict[str, int], start: int) -> StepMemory:
    peak = sum(parts.values())
    return StepMemory(
        peak_bytes=peak,
        start_bytes=start,
        parts=tuple(MemoryPart(name, parts.get(name, 0)) for name in MEMORY_PARTS),
        step_gradient_bytes=parts.get("gradients", 0),
        resident_bytes=600 * MB,
        resident_of="the timing process's resident set",
        peak_low_bytes=peak,
        peak_high_bytes=peak + MB // 10,
        processes=6,
    )


def with_memory(batch: int, mode: str, activations: int, energy: StepEnergy | None = None) -> ProfileRecord:
    state = {"weights": 5 * MB, "inputs": batch * 3136}
    if mode == "train":
        state |= {"optimizer state": 10 * MB, "gradients": 5 * MB}
    return dataclasses.replace(
        make_record(batch, "cpu", mode, 1.0 + batch / 10),
        memory=memory({**state, "activations": activations}, sum(state.values())),
        energy=energy,
        energy_unavailable="" if energy else "CPU energy (RAPL) not exposed by this machine",
    )


def test_the_section_states_each_combination_and_says_a_missing_counter_once(tmp_path: Path) -> None:
    records = [with_memory(batch, "inference", batch * 300_000) for batch in (1, 16, 64)]
    sections = memory_section(records, tmp_path)
    text = "\n".join(sections)
    assert "| 64-cpu-inference | 24.401 | 24.401-24.501 |" in text  # 5 MB + 0.2007 MB batch + 19.2 MB activations
    assert text.count("not exposed by this machine") == 1
    assert "optimizer state" not in text.split("\n\n")[1].splitlines()[0]  # no part that is zero everywhere
    picture = Image.open(tmp_path / "memory.png")
    description = picture.info["Description"]
    assert "activations" in description and "weights" in description and "cpu, inference" in description
    # The analysis (the memory_by_batch finding): the peak from the smallest batch to the largest, what grew, what not.
    [finding] = memory_by_batch(AnalysisData.of(records, []))
    sentence = finding.render(load_catalogue("en"))
    assert "the step's peak grew from 5.3 MB at batch 1 to 24.4 MB at batch 64" in sentence
    assert "activations 0.3 → 19.2 MB" in sentence and "parts the same at both: weights 5 MB" in sentence


def test_energy_is_stated_with_its_interval_where_measured() -> None:
    energy = StepEnergy(0.02, 0.019, 0.022, 150.0, "NVML total energy (GPU 0)", 20.0, 6, 6, 700.0, 1980.0, 2619.0)
    record = with_memory(16, "train", MB, energy)
    text = memory_markdown(record)
    assert (
        "Energy: 20.000 mJ per step (95 % CI 19.000-22.000, from 6 processes), 1.2500 mJ per sample, at 150 W while "
        "it ran; NVML total energy (GPU 0), which moved every 20 ms, polled during the timing: the power fitted over "
        "6 of its updates, times the step's time; power limit 700 W, SM clock 1980 MHz, memory clock 2619 MHz." in text
    )
    assert "| **peak** | **21.050** | 100 |" in text


def test_a_record_from_before_memory_was_measured_says_so() -> None:
    record = make_record(16, "cuda", "train", 2.0)
    assert "_Not measured: a format-7 record" not in memory_markdown(dataclasses.replace(record, format=6))
    assert "_Not measured: a format-6 record; rerun `dvc repro -f profile@cuda`._" in memory_markdown(
        dataclasses.replace(record, format=6)
    )


def machine_row(peak: float | None, energy: float | None = None) -> MachineRow:
    return MachineRow(
        group=1,
        machine="epyc",
        machine_id="m1",
        device="cpu",
        device_name="cpu",
        mode="train",
        batch_size=16,
        statistic="median",
        step_time_ms=4.0,
        step_time_ms_ci_low=3.9,
        step_time_ms_ci_high=4.1,
        step_time_cv=None,
        per_sample_ms=0.25,
        per_sample_ms_ci_low=0.24,
        per_sample_ms_ci_high=0.26,
        throughput_samples_per_s=4000.0,
        noisy=False,
        busy=False,
        model_digest="d",
        run_id="0123456789",
        peak_memory_mb=peak,
        energy_mj_per_sample=energy,
    )


def test_the_machines_table_has_a_memory_column_only_where_a_run_measured_it() -> None:
    assert "peak MB" not in rows_markdown([machine_row(None)])
    table = rows_markdown([machine_row(28.69), machine_row(None)])
    assert "| samples/s | peak MB | run |" in table and "mJ/sample" not in table
    assert "| 28.69 | `01234567` |" in table and f"| {NO_NUMBER} | `01234567` |" in table
    assert "| 28.69 | 1.25 | `01234567` |" in rows_markdown([machine_row(28.69, 1.25)])


def test_energy_over_processes_is_their_median_with_their_spread_or_the_reason_there_is_none() -> None:
    answers = [
        {"joules_per_step": j, "mean_power_w": 100.0 + i, "windows": 1, "update_period_s": 0.02, "counter": "NVML"}
        for i, j in enumerate((0.010, 0.011, 0.012, 0.013, 0.014, 0.015))
    ]
    found = energy_over_processes(answers)
    assert isinstance(found, StepEnergy)
    assert (found.joules_per_step, found.joules_per_step_low, found.joules_per_step_high) == (0.0125, 0.010, 0.015)
    assert (found.processes, found.windows, found.update_period_ms) == (6, 6, 20.0)
    missing = [*answers[:3], {"unavailable": "this GPU or driver has no total-energy counter (NVML: Not Supported)"}]
    assert energy_over_processes(missing) == "this GPU or driver has no total-energy counter (NVML: Not Supported)"
