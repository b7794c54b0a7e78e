"""Step report text and figures: achieved FLOP/s against the peak, anatomy verdicts, CPU vs GPU ratios.

Timings are the real ones of the H100 reference run (its timing.json files, read-only); the model's
FLOPs per sample come from this repository's committed metrics/graph.json.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from pathlib import Path

import pytest
import torch
from PIL import Image

from pipeline.profiling.artifacts import step_metrics
from pipeline.profiling.peak import DRIFT_WINDOWS, measure_roofs, onednn_operands, onednn_product
from pipeline.records.profile import (
    AllocatorWhatIf,
    OperatorRow,
    OperatorShare,
    ProfileRecord,
    StepAnalysis,
    flop_rate,
)
from pipeline.records.quantities import Interval, KernelStats, StepAnatomy
from pipeline.records.roofs import MachineRoofs, read_roofs, write_roofs
from pipeline.records.wording import kernel_table_markdown, operators_markdown
from pipeline.report.allocator_whatif import allocator_markdown, allocator_sentences
from pipeline.report.figures import cpu_vs_gpu_figure, roofline_figure
from pipeline.report.roofline import UNDECIDED, roofline_chart, roofline_markdown, roofline_points
from pipeline.report.step_analysis import (
    StepFacts,
    add_a_gpu_sentence,
    anatomy_markdown,
    cpu_vs_gpu_markdown,
    flop_rate_markdown,
    step_sentences,
)
from tests.helpers.records import gpu_run_file, make_record
from tests.helpers.repo import REPO_ROOT

GRAPH = json.loads((REPO_ROOT / "metrics" / "graph.json").read_text())
PEAKS = {"cpu": 1500.0, "cuda": 50_000.0}  # GFLOP/s, stand-ins for the measured peaks


def _anatomy(device: str, busy_pct: float, step_ms: float) -> StepAnatomy:
    verdict = "host-bound" if busy_pct < 50 else "device-bound"
    return StepAnatomy(
        device, 30, step_ms, step_ms * busy_pct / 100, busy_pct, 100 - busy_pct, 20, 3.0, 0.1, verdict, "x"
    )


def reference_facts(busy: dict[str, float] | None = None) -> list[StepFacts]:
    """Facts for the twelve reference combinations from their timing.json; anatomy where `busy` names it."""
    facts = []
    for batch in (1, 16, 64):
        for device in ("cpu", "cuda"):
            for mode in ("inference", "train"):
                name = f"{batch}-{device}-{mode}"
                step_ms = json.loads(gpu_run_file(name, "profile.json").read_text())["timing"]["step_time_ms_median"]
                rate = flop_rate(
                    GRAPH["forward_flops_per_sample" if mode == "inference" else "training_flops_per_sample"],
                    batch,
                    step_ms,
                    PEAKS[device],
                )
                anatomy = _anatomy(device, busy[name], step_ms * 2) if busy and name in busy else None
                # The reference run predates confidence intervals: a tight ±1 % stand-in around its mean.
                step = Interval(step_ms, 0.99 * step_ms, 1.01 * step_ms)
                facts.append(
                    StepFacts(
                        batch,
                        device,
                        mode,
                        step,
                        step * (1 / batch),
                        anatomy,
                        (),
                        rate,
                        "median of 7 fp32 products",
                    )
                )
    return facts


def test_flop_rate_is_model_flops_times_batch_over_step_time() -> None:
    rate = flop_rate(GRAPH["training_flops_per_sample"], 64, 20.0, 1000.0)
    expected = GRAPH["training_flops_per_sample"] * 64 / 0.020 / 1e9
    assert rate.achieved_gflops_per_s == pytest.approx(expected)
    assert rate.peak_pct == pytest.approx(expected / 10)
    assert flop_rate(1.0, 1, 1.0, 0.0).peak_pct == 0  # unknown peak: no share


def test_cpu_vs_gpu_section_gives_ratios_and_explains_the_slow_gpu_at_batch_1() -> None:
    facts = reference_facts({"1-cuda-inference": 4.8, "64-cuda-inference": 24.8})
    table = cpu_vs_gpu_markdown(facts)
    cpu1 = next(f for f in facts if (f.batch_size, f.device, f.mode) == (1, "cpu", "inference"))
    gpu1 = next(f for f in facts if (f.batch_size, f.device, f.mode) == (1, "cuda", "inference"))
    speed_up = cpu1.per_sample / gpu1.per_sample
    assert speed_up.value > 1 and speed_up.measurable  # the H100 run: cuda faster than its 16-vCPU host
    per_sample = f"{cpu1.per_sample.value:.4f} | {gpu1.per_sample.value:.4f}"
    row = f"| 1 | inference | {per_sample} | {speed_up.with_interval()} | 4.8 |"
    assert row in table
    assert len(re.findall(r"^\| \d+ \| (inference|train) \|", table, re.MULTILINE)) == 6
    sentences = step_sentences(facts)
    assert f"At batch 1 inference cuda is {speed_up.value:.1f}x faster than cpu" in " ".join(sentences)
    assert any(
        s == "On cuda inference at batch 1 the GPU is busy 5 % of the traced steps' time: host-bound; at 64, 25 %: "
        "host-bound."
        for s in sentences
    ), sentences
    # Where the GPU is slower (an older driver, a faster host), the sentence says why: the GPU waits for launches.
    slow_step = Interval(3 * cpu1.step.value, 3 * cpu1.step.low, 3 * cpu1.step.high)
    slower = [dataclasses.replace(f, step=slow_step, per_sample=slow_step) if f is gpu1 else f for f in facts]
    assert any(
        s.startswith("At batch 1 inference cuda is slower than cpu") and "idles 95 %" in s
        for s in step_sentences(slower)
    )
    assert not any(s.startswith("No GPU was profiled") for s in sentences)


def test_anatomy_text_names_the_rows_whose_traced_step_is_shorter_than_the_timed_interval() -> None:
    facts = [fact for fact in reference_facts({"1-cuda-train": 8.3, "64-cpu-train": 90.0}) if fact.anatomy]
    assert len(facts) == 2
    text = anatomy_markdown(facts)
    assert "Here each row's median traced step is within or above the timed step's 95 % interval." in text
    first = facts[0]
    assert first.anatomy is not None
    faster = dataclasses.replace(first.anatomy, step_ms=first.step.low / 2)
    text = anatomy_markdown([dataclasses.replace(first, anatomy=faster), *facts[1:]])
    assert f"Here {first.label} traced shorter than the low end of the timed median's 95 % interval" in text
    assert "within or above" not in text


def test_cpu_only_reports_say_how_to_add_a_gpu_and_count_what_it_adds() -> None:
    cpu_only = [fact for fact in reference_facts() if fact.device == "cpu"]
    text = add_a_gpu_sentence(cpu_only)
    assert cpu_vs_gpu_markdown(cpu_only) == text + "\n" and step_sentences(cpu_only)[-1] == text
    assert "`profile.devices: [cpu, cuda]`" in text and "`dvc repro`" in text
    count = len({(fact.batch_size, fact.mode) for fact in cpu_only})
    assert f"the {count} cuda combinations are profiled beside the CPU ones" in text
    # One more batch size in both modes adds two: the count is the matrix's, never a fixed "six".
    modes = {fact.mode: fact for fact in cpu_only}
    wider = [*cpu_only, *(dataclasses.replace(fact, batch_size=4096) for fact in modes.values())]
    assert f"the {count + len(modes)} cuda combinations are profiled" in add_a_gpu_sentence(wider)


def test_flop_rate_table_and_sentences_carry_the_share_of_peak() -> None:
    facts = reference_facts({"1-cuda-train": 8.3, "64-cuda-train": 14.3, "64-cpu-train": 90.0})
    table = flop_rate_markdown(facts)
    for fact in facts:
        assert fact.rate is not None
        row = (
            f"| {fact.batch_size} | {fact.device} | {fact.mode} | {fact.rate.flops_per_step / 1e6:.1f} | "
            f"{fact.step.value:.3f} | {fact.rate.achieved_gflops_per_s:.2f} | {PEAKS[fact.device]:.0f} | "
            f"{fact.rate.peak_pct:.2f} |"
        )
        assert row in table
    assert "cpu: median of 7 fp32 products; cuda: median of 7 fp32 products." in table
    sentences = step_sentences(facts)
    gpu_train = next(s for s in sentences if s.startswith("cuda train achieves"))
    assert "at batch 1" in gpu_train
    assert "at batch 64" in gpu_train
    assert gpu_train.endswith("far below the ceiling because the device waits for the host (see the anatomy).")
    cpu_train = next(s for s in sentences if s.startswith("cpu train achieves"))
    assert "although the step is spent inside operators" in cpu_train


def test_anatomy_table_has_a_verdict_per_row_and_kernel_table_the_launchers() -> None:
    facts = reference_facts({"1-cuda-train": 8.3, "64-cuda-train": 14.3, "64-cpu-train": 90.0})
    table = anatomy_markdown(facts)
    assert table.count("**host-bound**") == 4  # two table cells, two verdict lines
    assert "| 64 | cpu | train |" in table
    # The record says "device-bound" (the words before format 4); the table says it as a CPU user would.
    assert "- batch 64 cpu train: **operator-bound**: " in table and "device-bound" not in table
    # On the CPU the sentence is rebuilt from the numbers, naming the profiler's hooks among the time outside operators.
    assert "outside them (Python and framework code between operators, and the profiler's own hooks)." in table
    assert anatomy_markdown(reference_facts()).startswith("_No step anatomy")
    kernel = KernelStats("cuBLAS GEMM (sm80)", 2.0, 0.05, 25.0, 40.0, "aten::addmm", "sm80_xmma_gemm_x")
    markdown = kernel_table_markdown([kernel], "#### Top kernels")
    assert "| 1 | cuBLAS GEMM (sm80) | `aten::addmm` | 2 | 0.0500 | 25.0 | 40.0 |" in markdown


def test_figures_draw_the_peak_and_both_devices(tmp_path: Path) -> None:
    facts = reference_facts()
    roofline_figure(facts, PEAKS, tmp_path / "roofline.png")
    cpu_vs_gpu_figure(facts, tmp_path / "cpu_vs_gpu.png")
    for name in ("roofline.png", "cpu_vs_gpu.png"):
        with Image.open(tmp_path / name) as image:
            assert image.width > 500
            assert image.height > 300


def test_measured_cpu_roofs_are_positive_rates_with_their_methods(tmp_path: Path) -> None:
    windows: list[int] = []
    roofs = measure_roofs(
        torch.device("cpu"),
        repeats=3,
        size=256,
        triad_elements=1 << 20,
        drift_probe_s=0.4,
        progress=lambda: windows.append(1),
    )
    drift = roofs.speed_drift
    assert len(drift.window_medians_ms) == len(windows) == DRIFT_WINDOWS and drift.window_s == pytest.approx(0.05)
    assert all(0 < median < 1000 for median in drift.window_medians_ms) and drift.half_width_pct > 0
    assert measure_roofs(torch.device("cpu"), repeats=1, size=64, triad_elements=1024).speed_drift.half_width_pct == 0
    matmul, triad = roofs.matmul_gflops_per_s, roofs.triad_gb_per_s
    assert matmul.best >= matmul.median >= matmul.worst > 0.1  # any working CPU multiplies 256x256 faster
    assert triad.best >= triad.median >= triad.worst > 0.1  # and streams more than 100 MB/s
    assert matmul.repeats == triad.repeats == 3 and roofs.threads == torch.get_num_threads()
    assert roofs.ridge_flops_per_byte == pytest.approx(matmul.best / triad.best)
    # The roof is the faster of the two libraries torch computes an fp32 product with on a CPU, both timed.
    assert [kernel.kernel for kernel in roofs.matmul_kernels] == ["torch.mm", "oneDNN 1x1 convolution"]
    fastest = max(roofs.matmul_kernels, key=lambda kernel: kernel.gflops_per_s.best)
    assert matmul == fastest.gflops_per_s and roofs.matmul_kernel == fastest.kernel
    rates = [f"{kernel.kernel} ({kernel.gflops_per_s.best:.1f} GFLOP/s)" for kernel in roofs.matmul_kernels]
    assert roofs.method == (
        f"fastest of 3 fp32 256x256 matrix products through each of {rates[0]} and {rates[1]}, the faster: "
        f"{fastest.kernel}; {roofs.threads} CPU thread{'' if roofs.threads == 1 else 's'}"
    )
    assert roofs.bandwidth_method.startswith("fastest of 3 STREAM triads a = b + s*c over 3 x 4 MiB fp32 arrays")
    text = write_roofs(MachineRoofs({"cpu": "test"}, (roofs,)))
    path = tmp_path / "roofs.json"
    path.write_text(text)
    assert read_roofs(path) == MachineRoofs({"cpu": "test"}, (roofs,))
    assert read_roofs(path).for_device("cuda") is None


def test_the_onednn_roof_times_the_same_product_as_torch_mm() -> None:
    """The 1x1 convolution the oneDNN roof times computes exactly left @ right (2 n^3 FLOPs), through oneDNN's
    convolution as the model's convolutions run, on one thread as on two (torch takes its own kernel for fewer
    than 256 channels, or for a batch under 16 on one thread: the roofs stage runs 2048 wide in a batch of 16)."""
    generator = torch.Generator().manual_seed(1)
    left, right = torch.randn(256, 256, generator=generator), torch.randn(256, 256, generator=generator)
    pixels, weights = onednn_operands(left, right)
    assert pixels.shape == (16, 256, 1, 16) and pixels.is_contiguous(memory_format=torch.channels_last)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler, torch.no_grad():
                product = onednn_product(torch.nn.functional.conv2d(pixels, weights))
            assert "aten::mkldnn_convolution" in {event.key for event in profiler.key_averages()}, count
            torch.testing.assert_close(product, left @ right, rtol=1e-4, atol=1e-3)
    finally:
        torch.set_num_threads(threads)


def test_step_metrics_have_the_same_names_on_every_device() -> None:
    rate = flop_rate(1e6, 1, 1.0, 100.0)
    gpu = step_metrics(StepAnalysis(_anatomy("cuda", 4.8, 1.0), rate, "m", (), (), 0.0))
    cpu = step_metrics(StepAnalysis(_anatomy("cpu", 90.0, 1.0), flop_rate(1e6, 1, 1.0, 0.0), "m", (), (), 0.0))
    assert set(gpu) == set(cpu)
    assert gpu["busy_pct"] == 4.8
    assert gpu["host_bound"] == 1.0
    assert cpu["host_bound"] == 0.0
    assert gpu["achieved_gflops_per_s"] == pytest.approx(1.0)
    assert gpu["peak_pct"] == pytest.approx(1.0)


def _with_whatif(record: ProfileRecord, default_ms: float, faults: float, tuned_faults: float) -> ProfileRecord:
    """`record` with an allocator what-if: glibc's defaults at `default_ms` (±2 %), the given page faults."""
    whatif = AllocatorWhatIf(
        "glibc 2.36 malloc, defaults",
        default_ms,
        default_ms * 0.98,
        default_ms * 1.02,
        faults,
        tuned_faults,
        (OperatorShare("aten::mkldnn_convolution", 50.0), OperatorShare("aten::add", 20.0)),
    )
    return dataclasses.replace(record, allocator_whatif=whatif)


def test_allocator_section_compares_each_cpu_combination_and_says_what_is_not_the_allocators() -> None:
    faulting = _with_whatif(make_record(64, "cpu", "train", 50.0, (("aten::mkldnn_convolution", 60.0),)), 70, 9000, 0)
    same = _with_whatif(make_record(16, "cpu", "train", 20.0, (("aten::add", 20.0),)), 20.2, 300, 0)
    drift = _with_whatif(make_record(1, "cpu", "train", 8.0, (("aten::add", 10.0),)), 7.0, 0, 0)
    gpu = make_record(64, "cuda", "train", 2.0)  # no what-if on a GPU: no row
    table = allocator_markdown([faulting, same, drift, gpu])
    assert "| 64 train | 70.000 (68.600-71.400) | 50.000 (49.000-51.000) | 1.40x (1.35-1.46x) | 9,000 | 0.00 |" in table
    assert "`aten::mkldnn_convolution` 50.0 → 60.0 %" in table
    assert "| 16 train |" in table and "the data cannot tell them apart" in table and "cuda" not in table
    (sentence,) = allocator_sentences([faulting, same, drift, gpu])
    assert (
        "measurably slower with glibc malloc's defaults than with the tuned allocator, with the same operators on the "
        "same values: batch 64 "
        "train 1.40x (1.35-1.46x)."
    ) in sentence
    assert "For 16-cpu-train (0.97-1.05x) the interval includes 1: the data cannot tell whether" in sentence
    assert "Neither set-up page-faulted in 1-cpu-train (0.88x (0.84-0.91x))" in sentence
    assert allocator_sentences([gpu]) == [] and "No allocator what-if in these profiles" in allocator_markdown([gpu])


def _paired(record: ProfileRecord, pairs: tuple[float, ...]) -> ProfileRecord:
    """`record`'s what-if as the stage now measures it: the slowdown of each pair of processes, median and CI."""
    assert record.allocator_whatif is not None
    ordered = sorted(pairs)
    whatif = dataclasses.replace(
        record.allocator_whatif,
        slowdown=statistics.median(pairs),
        slowdown_ci_low=ordered[0],
        slowdown_ci_high=ordered[-1],
        process_slowdowns=pairs,
        process_page_faults=(record.allocator_whatif.page_faults_per_step,) * len(pairs),
    )
    return dataclasses.replace(record, allocator_whatif=whatif)


def test_a_paired_allocator_whatif_states_the_pairs_ratio_and_a_direction_only_where_its_interval_shows_one() -> None:
    """Paired, the ratio and its CI are the pairs' own (not built from the two rows' intervals, which here would
    overlap); a step the defaults ran measurably faster is said to be faster, not hidden under "up to"."""
    slower = _paired(_with_whatif(make_record(64, "cpu", "train", 50.0), 52.0, 9000, 1), (1.03, 1.04, 1.05))
    tie = _paired(_with_whatif(make_record(16, "cpu", "train", 20.0), 20.0, 2, 1), (0.99, 1.0, 1.02))
    faster = _paired(_with_whatif(make_record(1, "cpu", "train", 8.0), 7.6, 2, 1), (0.94, 0.95, 0.96))
    table = allocator_markdown([slower, tie, faster])
    assert (
        "| 64 train | 52.000 (50.960-53.040) | 50.000 (49.000-51.000) | 1.04x (1.03-1.05x) | 9,000 (9,000-9,000) "
        "| 1.00 |" in table
    )
    assert "| 16 train |" in table and "the data cannot tell them apart (0.99-1.02x)" in table
    assert "ratio is taken pair by pair" in table
    (sentence,) = allocator_sentences([slower, tie, faster])
    assert "on the same values: batch 64 train 1.04x (1.03-1.05x)." in sentence
    assert "Paired: each defaults process ran next to a tuned one" in sentence and "Not paired" not in sentence
    assert "For 16-cpu-train (0.99-1.02x) the interval includes 1" in sentence
    assert "Faster with the defaults: 1-cpu-train (0.95x (0.94-0.96x))." in sentence
    (none_slower,) = allocator_sentences([tie, faster])
    assert none_slower == (
        "Memory allocation: slower with glibc malloc's defaults than with the tuned allocator at no CPU step that "
        "the data decide; faster with the defaults: 1-cpu-train (0.95x (0.94-0.96x)). For 16-cpu-train (0.99-1.02x) "
        "the interval includes 1: the data cannot tell whether the defaults cost them time."
    )
    assert "defaults ÷ tuned (paired) 1.04x (1.03-1.05x)" in operators_markdown(slower)


def _with_work(record: ProfileRecord, bytes_per_step: float, operators: tuple[OperatorRow, ...]) -> ProfileRecord:
    """`record` with counted bytes, a 100 GFLOP/s matmul roof and a 10 GB/s memory roof (ridge 10 FLOP/byte)."""
    combination, step_ms = record.combination, record.timing.step_time_ms_median
    rate = flop_rate(
        1e6, combination.batch_size, step_ms, 100.0, bytes_per_step=bytes_per_step, bandwidth_gb_per_s=10.0
    )
    analysis = dataclasses.replace(record.analysis, flop_rate=rate)
    return dataclasses.replace(record, analysis=analysis, top_operators=operators)


def test_roofline_places_steps_and_operators_under_both_roofs_and_names_which_are_memory_bound(
    tmp_path: Path,
) -> None:
    conv = OperatorRow("aten::mkldnn_convolution", 2.0, 1.0, 1.0, None, None, 60.0, 50.0, 1.0)  # 50 FLOP/byte
    addmm = OperatorRow("aten::addmm", 2.0, 0.5, 0.5, None, None, 20.0, 2.0, 4.0)  # 0.5 FLOP/byte
    relu = OperatorRow("aten::relu", 2.0, 0.3, 0.3, None, None, 10.0, None, None)  # no FLOPs: not placed
    record = _with_work(make_record(64, "cpu", "inference", 8.0), 32e6, (conv, addmm, relu))  # 64 MFLOP / 32 MB
    unmeasured = make_record(1, "cpu", "inference", 0.5)  # no memory roof: a record from before the roofs stage
    points = roofline_points([record, unmeasured])
    by_name = {point.name: point for point in points}
    assert set(by_name) == {"whole step", "aten::mkldnn_convolution", "aten::addmm"}
    step = by_name["whole step"]
    assert step.intensity == pytest.approx(2.0) and step.achieved.value == pytest.approx(8.0)  # 64 MFLOP in 8 ms
    assert step.achieved.low == pytest.approx(0.064 / 0.00816) and step.achieved.high == pytest.approx(0.064 / 0.00784)
    assert step.roof_gflops_per_s == pytest.approx(20.0) and step.bound == UNDECIDED  # 10 GB/s x 2 FLOP/byte
    assert by_name["aten::mkldnn_convolution"].roof_gflops_per_s == 100.0  # right of the ridge: the matmul roof
    assert by_name["aten::mkldnn_convolution"].roof_pct == pytest.approx(50.0)  # 50 MFLOP in 1 ms of 100
    text = roofline_markdown(points)
    assert "they meet at **10.0 FLOP/byte**" in text
    assert (
        "Compute-bound at their counted intensity (at least 2x right of the ridge; re-reads from DRAM would have to "
        "multiply their traffic by more than 5.0x to move the least of them left of it): `aten::mkldnn_convolution` "
        "(inference batch 64; 50.0 FLOP/byte). Left of the ridge at their counted intensity, not decided: whole step "
        "(inference batch 64; 2.0 FLOP/byte); `aten::addmm` (inference batch 64; 0.5 FLOP/byte)." in text
    )
    assert f"| 64 | cpu | inference | `aten::addmm` | 0.50 | 4.00 | 5.0 | 80.0 | {UNDECIDED} |" in text
    assert "Above the" not in text  # every point under its roof
    # A small matrix product beats the triad roof (as `aten::addmm` at batch 1 did on Zen 5): the report names the
    # points with the bytes each call moves, and says what the roof does not count rather than which cause held.
    cached = OperatorRow("aten::addmm", 2.0, 0.1, 0.1, None, None, 20.0, 2.0, 4.0)  # 20 GFLOP/s at 0.5 FLOP/byte
    text = roofline_markdown(roofline_points([_with_work(make_record(1, "cpu", "inference", 8.0), 32e6, (cached,))]))
    assert (
        " Above the memory roof: `aten::addmm` (inference batch 1: 400 % of its roof, 2.0 MB per call on average). "
        "That roof is one thread's STREAM triad over arrays far beyond the caches, counted as STREAM counts it (no "
        "write-allocate traffic)" in text
    )
    assert "Which of these holds is not measured here" in text and "does not limit these" not in text
    assert "Above the matmul roof" not in text
    fast = OperatorRow("aten::mkldnn_convolution", 2.0, 0.25, 0.25, None, None, 60.0, 50.0, 1.0)  # 200 GFLOP/s
    text = roofline_markdown(roofline_points([_with_work(make_record(64, "cpu", "train", 8.0), 32e6, (fast,))]))
    assert (
        " Above the matmul roof: `aten::mkldnn_convolution` (train batch 64: 200 % of its roof, 0.5 MB per call on "
        "average): an operator's rate comes from one traced pass (no interval), the roof from the fastest of 15 "
        "products." in text
    )
    assert roofline_markdown([]).startswith("_No roofline")
    roofline_chart(points, tmp_path / "roofline.png")
    with Image.open(tmp_path / "roofline.png") as image:
        assert image.width > 500 and image.height > 400


def test_the_defaults_page_faults_are_given_as_the_processes_median_and_range() -> None:
    """Six processes fault 0, 0, 0.1, 133.7, 151.7 and 153.6 times per step: the median of an even count is the mean
    of the middle two (66.9), which matches no process, so the range is printed beside it."""
    record = _paired(_with_whatif(make_record(64, "cpu", "inference", 10.0), 12.0, 67, 0), (1.1,) * 6)
    assert record.allocator_whatif is not None
    faults = (0.0, 0.0, 0.1, 133.7, 151.7, 153.6)
    whatif = dataclasses.replace(
        record.allocator_whatif, page_faults_per_step=statistics.median(faults), process_page_faults=faults
    )
    table = allocator_markdown([dataclasses.replace(record, allocator_whatif=whatif)])
    assert (
        "| 67 (0.00-154) | 0.00 |" in table
        and "the mean of the middle two" in table
        and "median process's" not in table
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_busy_share_names_the_mean_step_it_is_a_share_of(device: str) -> None:
    """The share of a traced pass inside operators (or GPU work) is its total busy time over its total span: a share
    of the mean step. Where the median step differs from the mean, the sentence names the mean beside the median, and
    share x mean gives back the busy time per step."""
    anatomy = StepAnatomy(device, 30, 0.606, 0.5156, 82.9, 17.1, 20, 3.0, 0.1, "operator-bound", "x")
    facts = [dataclasses.replace(reference_facts()[0], anatomy=anatomy)]
    line = next(line for line in anatomy_markdown(facts).splitlines() if line.startswith("- "))
    share, mean, median = (
        float(value)
        for value in re.search(
            r"(\d+\.\d) % of the traced steps' time \(a mean of (\d+\.\d+) ms a step; the median step (\d+\.\d+) ms\)",
            line,
        ).groups()  # type: ignore[union-attr]
    )
    assert share * mean / 100 == pytest.approx(anatomy.busy_ms, abs=5e-4) and median == 0.606
    assert "of the 0.606 ms traced step" not in line
