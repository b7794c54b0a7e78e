"""The analysis's findings (pipeline/report/findings.py): each kind said where its rule holds on the data and not
said (or said as "cannot tell") where it fails, on synthetic records; and each renders in every language."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics

import pytest

from pipeline.profiling.trace_analysis import analyse_trace, read_trace
from pipeline.records.profile import PairedComparison, ProfileRecord, TraceCheck, flop_rate
from pipeline.records.quantities import MemoryPart, StepMemory, StepPart
from pipeline.records.statistics import GRADIENTS
from pipeline.report.catalogue import LANGUAGES, load_catalogue
from pipeline.report.findings import (
    PARTS_MESSAGES,
    AnalysisData,
    Finding,
    Measured,
    closer_to_roof,
    excess_without_update,
    findings,
    gpu_against_cpu,
    memory_by_batch,
    per_sample_direction,
    per_step_or_per_sample,
    processes_to_decide,
    traced_scaling_differs,
    train_against_inference,
    training_against_profile,
    update_per_step,
    what_sets_the_cost,
    why_per_sample_changes,
)
from tests.helpers.records import gpu_run, gpu_run_file, make_comparisons, make_record, record_metrics

STEPS = 30


def wobble(mean: float, spread: float) -> tuple[float, ...]:
    """`STEPS` per-step values around `mean`, spread ±`spread` of it, in a fixed pattern."""
    return tuple(round(mean * (1 + spread * math.sin(1.7 * step)), 6) for step in range(STEPS))


def with_parts(
    record: ProfileRecord,
    parts: dict[tuple[str, str], float],
    spread: float = 0.03,
    mflops: dict[str, float] | None = None,
) -> ProfileRecord:
    """`record` with traced parts: (phase, group) -> mean ms per step; FLOPs per step by group where given."""
    flops = mflops or {}
    made = tuple(
        StepPart(phase, group, wobble(mean, spread), flops.get(group) if phase == "forward" else None)
        for (phase, group), mean in parts.items()
    )
    return dataclasses.replace(record, analysis=dataclasses.replace(record.analysis, parts=made))


def training(
    batch: int, step_ms: float, optimizer_ms: float, conv_ms_per_sample: float, outside_ms: float = 0.2
) -> ProfileRecord:
    """A training step: convolutions a third forward, two thirds backward; 3 MFLOP per sample (inference: 1)."""
    parts = {
        ("forward", "convolution"): conv_ms_per_sample * batch / 3,
        ("backward", "convolution"): 2 * conv_ms_per_sample * batch / 3,
        ("optimizer", "optimizer"): optimizer_ms,
        ("outside", "outside"): outside_ms,
    }
    record = make_record(batch, "cpu", "train", step_ms)
    analysis = dataclasses.replace(record.analysis, flop_rate=flop_rate(3e6, batch, step_ms, 100.0))
    return with_parts(dataclasses.replace(record, analysis=analysis), parts)


def inference(batch: int, step_ms: float, conv_ms_per_sample: float) -> ProfileRecord:
    parts = {("forward", "convolution"): conv_ms_per_sample * batch, ("outside", "outside"): 0.05}
    return with_parts(make_record(batch, "cpu", "inference", step_ms), parts)


def said(found: list[Finding], message: str) -> list[Finding]:
    return [finding for finding in found if finding.message == message]


def rendered(finding: Finding) -> dict[str, str]:
    return {language: finding.render(load_catalogue(language)) for language in LANGUAGES}


# --- per_sample_direction -------------------------------------------------------------------------------------------


def test_a_direction_only_where_the_paired_interval_excludes_1() -> None:
    records = [make_record(1, "cpu", "train", 6.0), make_record(16, "cpu", "train", 15.0)]
    decided = make_comparisons("cpu", {("16-cpu-train", "1-cpu-train"): (0.16, 0.15, 0.17, (0.16,) * 6)})
    [finding] = per_sample_direction(AnalysisData.of(records, [decided]))
    assert finding.message == "finding_per_sample_falls"
    assert "fell to 0.160× (95 % CI 0.150–0.170" in rendered(finding)["en"]
    assert "降至 0.160 倍（95% 置信区间 0.150–0.170" in rendered(finding)["zh"]

    undecided = make_comparisons("cpu", {("16-cpu-train", "1-cpu-train"): (0.98, 0.96, 1.01, (0.98,) * 6)})
    [finding] = per_sample_direction(AnalysisData.of(records, [undecided]))
    assert finding.message == "finding_per_sample_undecided_more"
    text = rendered(finding)["en"]
    assert "cannot tell" in text and "fell" not in text and "rose" not in text
    # the side toward 1, ln(1.01/0.98), against the distance ln(1/0.98): 6 processes x (0.0302/0.0202)^2 = 13.4 -> 14
    assert finding.values["needed"] == processes_to_decide(undecided.comparisons[0], 6) == 14


def test_undecided_ratio_far_inside_its_interval_says_more_processes_would_not_settle_it() -> None:
    records = [make_record(1, "cpu", "train", 6.0), make_record(16, "cpu", "train", 15.0)]
    near_one = make_comparisons("cpu", {("16-cpu-train", "1-cpu-train"): (0.999, 0.95, 1.05, (0.999,) * 6)})
    [finding] = per_sample_direction(AnalysisData.of(records, [near_one]))
    assert finding.message == "finding_per_sample_undecided"
    assert "more than 40 timing processes" in rendered(finding)["en"]


# --- why_per_sample_changes and per_step_or_per_sample --------------------------------------------------------------


def batch_pair(
    optimizer_ms: float = 5.0,
    ratio: tuple[float, float, float] = (0.117, 0.11, 0.125),
    processes: tuple[float, ...] | None = None,
) -> AnalysisData:
    """Batch 1 and 64 of training; the default paired ratio agrees with the traced steps' (43.6/64 over 5.8 ms).
    `processes`: each timing process's ratio (by default six at the median, no spread)."""
    small = training(1, 6.0, optimizer_ms, 0.6)
    large = training(64, 45.0, optimizer_ms, 0.6)
    comparisons = make_comparisons("cpu", {("64-cpu-train", "1-cpu-train"): (*ratio, processes or (ratio[0],) * 6)})
    return AnalysisData.of([small, large], [comparisons])


def test_the_per_sample_saving_is_attributed_to_the_groups_that_moved() -> None:
    [finding] = why_per_sample_changes(batch_pair())
    assert finding.message == "finding_change_attributed_saved"
    groups = [item["group"].key for item in finding.values["groups"].items]
    # per sample: the update 5 ms -> 5/64 ms, the outside 0.2 -> 0.2/64 ms; convolutions 0.6 ms at both
    assert groups == ["group_optimizer", "group_outside"]
    optimizer = finding.cites["optimizer"]
    expected = 100 * (5 - 5 / 64) / (5.2 - 5.2 / 64)
    assert optimizer.low < expected < optimizer.high and optimizer.value == pytest.approx(expected, rel=0.01)
    english = rendered(finding)["en"]
    assert f"of the traced saving: the Adadelta update {optimizer.value:.1f} % ({optimizer.low:.1f} to" in english
    assert f"在被分析步骤节省的时间中：Adadelta 优化器更新占 {optimizer.value:.1f}%" in rendered(finding)["zh"]
    # What the split is of, beside what the timed steps saved, and why the traced steps may stand for them.
    assert f"the timed steps saved {6.0 - 45.0 / 64:.4f} ms per sample" in english  # their medians, per sample
    assert "the traced steps ran like the timed steps (their per-sample ratio, 0.117× with 95 % CI" in english
    assert "lies where one more timing process would fall, 95 %: 0.110–0.125; paired timing 0.117×" in english
    assert "落在若再多跑一个计时进程其比值 95% 会落入的范围（0.110–0.125）内" in rendered(finding)["zh"]
    # The named parts and the rest make up the whole traced saving.
    rest = 100 - finding.cites["optimizer"].value - finding.cites["outside"].value
    assert finding.values["rest"] == pytest.approx(rest)
    assert (
        "in parts not named (each under 2 % of the change, not clear of 0, or time outside operators that the "
        f"profiler's hooks may be all of): {rest:.1f} %." in english
    )


def test_traced_passes_that_scaled_otherwise_than_the_timing_explain_nothing_and_are_named() -> None:
    """The traced steps fall to 0.117x per sample (43.6/64 over 5.8 ms); paired timing says 0.30x (0.28-0.32): no
    finding reads the traced parts of that change, and one sentence gives both ratios."""
    data = batch_pair(ratio=(0.30, 0.28, 0.32))
    assert why_per_sample_changes(data) == []
    assert what_sets_the_cost(data) == [] and per_step_or_per_sample(data) == [] and closer_to_roof(data) == []
    [finding] = traced_scaling_differs(data)
    [item] = finding.values["pairs"].items
    assert (item["small"], item["large"], item["paired_low"], item["paired_high"]) == (1, 64, 0.28, 0.32)
    assert item["traced_high"] < 0.28 and item["traced_low"] < item["traced"] < item["traced_high"]
    text = rendered(finding)
    assert "batch 1 → 64: traced time per sample 0.11" in text["en"]
    assert "against 0.300× paired (95 % CI 0.280–0.320; where one more timing process would fall" in text["en"]
    assert "配对计时为 0.300 倍（95% 置信区间 0.280–0.320；再多一个计时进程时" in text["zh"]
    # Where they agree, nothing is said and the attribution stands.
    assert traced_scaling_differs(batch_pair()) == [] and why_per_sample_changes(batch_pair())


def test_no_attribution_where_the_paired_ratio_did_not_decide_the_direction() -> None:
    assert why_per_sample_changes(batch_pair(ratio=(0.99, 0.95, 1.03))) == []


def test_no_attribution_where_the_traced_steps_moved_against_the_paired_ratio() -> None:
    assert why_per_sample_changes(batch_pair(ratio=(1.2, 1.1, 1.3))) == []


def test_work_paid_per_step_and_work_that_grows_with_the_batch_are_told_apart() -> None:
    found = per_step_or_per_sample(batch_pair())
    [fixed] = said(found, "finding_fixed_per_step")
    [growing] = said(found, "finding_grows_with_batch")
    assert [item["group"].key for item in fixed.values["groups"].items] == ["group_optimizer", "group_outside"]
    assert [item["group"].key for item in growing.values["groups"].items] == ["group_convolution"]
    assert growing.cites["convolution"].low > 64**0.75
    assert "so per sample every listed part fell at least" in rendered(fixed)["en"]
    assert "主要按步计的开销" in rendered(fixed)["zh"]


def test_what_sets_the_cost_is_said_where_per_step_work_leads_the_small_batch_and_per_sample_work_the_large() -> None:
    [finding] = what_sets_the_cost(batch_pair())
    # batch 1: the update 5 ms and the outside 0.2 ms of 5.8 ms; batch 64: convolutions 38.4 ms of 43.6 ms
    assert finding.values["fixed_share"] == pytest.approx(100 * 5.2 / 5.8, rel=0.01)
    assert finding.values["growing_share"] == pytest.approx(100 * 38.4 / 43.6, rel=0.01)
    assert "（Adadelta 优化器更新；算子之外的时间）" in rendered(finding)["zh"]
    assert what_sets_the_cost(batch_pair(optimizer_ms=0.1)) == []  # batch 1: per-step work 0.3 of 0.9 ms


def test_a_group_whose_growth_interval_straddles_a_bound_is_not_classed() -> None:
    small = with_parts(make_record(1, "cpu", "train", 6.0), {("optimizer", "optimizer"): 5.0}, spread=0.9)
    # 2.8x = 64^0.25: a growth of 2.5x whose interval reaches past it is neither fixed nor proportional
    large = with_parts(make_record(64, "cpu", "train", 45.0), {("optimizer", "optimizer"): 12.5}, spread=0.9)
    assert per_step_or_per_sample(AnalysisData.of([small, large], [])) == []


# --- closer_to_roof -------------------------------------------------------------------------------------------------


def conv_rates(small_ms: float, large_ms: float) -> AnalysisData:
    small = with_parts(
        make_record(1, "cpu", "inference", 0.3), {("forward", "convolution"): small_ms}, mflops={"convolution": 21.6}
    )
    large = with_parts(
        make_record(64, "cpu", "inference", 11.0),
        {("forward", "convolution"): large_ms},
        mflops={"convolution": 21.6 * 64},
    )
    return AnalysisData.of([small, large], [])


def test_closer_to_the_roof_only_where_the_larger_batch_is_faster_beyond_both_intervals() -> None:
    [finding] = closer_to_roof(conv_rates(0.2, 7.0))  # 108 GFLOP/s -> 197 GFLOP/s
    assert finding.message == "finding_closer_to_roof"
    assert finding.values["rate_small"] == pytest.approx(108, rel=0.01)
    assert finding.values["rate_large"] == pytest.approx(197.5, rel=0.01)
    assert finding.values["pct_large"] == pytest.approx(197.5, rel=0.01)  # make_record's stand-in roof: 100 GFLOP/s
    assert closer_to_roof(conv_rates(0.2, 0.2 * 64 * 1.01)) == []  # the same rate within the intervals


# --- train_against_inference ----------------------------------------------------------------------------------------


def modes_at(
    batch: int,
    optimizer_ms: float,
    ratio: float,
    outside_ms: float = 0.2,
    processes: tuple[float, ...] | None = None,
) -> AnalysisData:
    """Training and inference at `batch`, paired `ratio` (±3 %, or the median and range of `processes`, each timing
    process's ratio)."""
    records = [training(batch, 6.0, optimizer_ms, 0.3, outside_ms), inference(batch, 0.3, 0.1)]
    paired = (ratio, ratio * 0.97, ratio * 1.03, (ratio,) * 6)
    if processes is not None:
        paired = (statistics.median(processes), min(processes), max(processes), processes)
    name = f"{batch}-cpu-train", f"{batch}-cpu-inference"
    return AnalysisData.of(records, [make_comparisons("cpu", {name: paired})])


def test_the_update_is_named_as_why_training_costs_more_than_its_flops_only_where_it_is() -> None:
    [finding] = train_against_inference(modes_at(1, 5.0, 36.0))  # traced: 5.5 / 0.15 = 36.7x
    assert finding.message == "finding_train_update_explains"
    # traced: 0.3 + 5 + 0.2 ms against 0.15: without the update (0.5 ms) 3.33x
    assert finding.values["without"] == pytest.approx(0.5 / 0.15, rel=0.02)
    phases = [item["phase"].key for item in finding.values["phases"].items]
    assert phases == ["phase_forward", "phase_backward", "phase_optimizer", "phase_outside"]
    assert "训练一步的耗时是推理一步的 36.00 倍" in rendered(finding)["zh"]

    [beyond] = train_against_inference(modes_at(1, 5.0, 48.0, outside_ms=2.0))  # traced: 7.3 / 0.15 = 48.7x
    assert beyond.message == "finding_train_more_than_flops"  # without the update: 2.3 / 0.15 = 15x, beyond 4.5x
    [tiny] = train_against_inference(modes_at(1, 0.01, 20.0))
    assert tiny.message == "finding_train_above_flops"  # the traced ratio (3.4x) disagrees with the paired: no cause
    [agree] = train_against_inference(modes_at(1, 0.01, 3.4))  # traced 3.4x, above 3x, within 1.5x: no cause
    assert agree.message == "finding_train_above_flops_agree" and "cannot say why" not in rendered(agree)["en"]
    [within] = train_against_inference(modes_at(1, 5.0, 2.9))
    assert within.message == "finding_train_against_flops"
    assert "more than" not in rendered(within)["en"] and "without it" not in rendered(within)["en"]


# --- a traced pass against where one more timing process would fall -------------------------------------------------

# Six timing processes' per-sample ratios, 1 -> 64: median 0.130, its 95 % interval their range 0.122-0.138, one more
# process within 0.114-0.148 (prediction). The traced steps' ratio, 0.117 (0.116-0.119), lies below the median's
# interval and inside the prediction.
SPREAD_PROCESSES = (0.122, 0.125, 0.128, 0.132, 0.135, 0.138)
# The same median, the processes within 0.128-0.132: one more within 0.126-0.134, which the traced ratio misses.
TIGHT_PROCESSES = (0.128, 0.129, 0.130, 0.130, 0.131, 0.132)
DECIDES_EN = "What would decide it: a traced pass that runs like the timed steps; rerun the profile stage on a quieter"
DECIDES_ZH = "要判断这一点，需要一次与计时步骤运行情况一致的被分析执行：在更安静的机器上重新运行性能分析阶段"


def test_a_traced_ratio_outside_the_medians_interval_but_where_one_more_process_would_fall_explains() -> None:
    """One traced pass is one more process's worth of steps: it is held against where one more timing process's ratio
    would fall, not against the narrower interval of the processes' median."""
    data = batch_pair(ratio=(0.130, 0.122, 0.138), processes=SPREAD_PROCESSES)
    assert traced_scaling_differs(data) == []
    [finding] = why_per_sample_changes(data)
    assert finding.cites["change"].excludes(0.0) and finding.values["traced_high"] < 0.122
    assert (finding.values["one_more_low"], finding.values["one_more_high"]) == pytest.approx((0.114, 0.148), abs=1e-3)
    english, chinese = rendered(finding)["en"], rendered(finding)["zh"]
    # The traced ratio, where one more process would fall, and the paired median with its interval, each named.
    assert "(their per-sample ratio, 0.117× with 95 % CI 0.116–0.119, lies where one more timing process" in english
    assert "would fall, 95 %: 0.114–0.148; paired timing 0.130×, 95 % CI 0.122–0.138)" in english
    assert "落在若再多跑一个计时进程其比值 95% 会落入的范围（0.114–0.148）内；配对计时为 0.130 倍" in chinese
    # The rules that read how the traced steps scaled read this pair too.
    assert per_step_or_per_sample(data) and what_sets_the_cost(data)


def test_a_traced_ratio_outside_where_one_more_process_would_fall_is_refused_with_what_would_decide_it() -> None:
    data = batch_pair(ratio=(0.130, 0.128, 0.132), processes=TIGHT_PROCESSES)
    assert why_per_sample_changes(data) == [] and per_step_or_per_sample(data) == []
    [finding] = traced_scaling_differs(data)
    text = rendered(finding)
    said = "against 0.130× paired (95 % CI 0.128–0.132; where one more timing process would fall, 95 %: 0.126–0.134)"
    assert said in text["en"]
    assert "What would decide it: traced passes that run like the timed steps; rerun the profile stage" in text["en"]
    assert "(`profile.active_steps`, 8 here)" in text["en"]  # the records' traced steps per pass
    assert "需要与计时步骤运行情况一致的被分析执行" in text["zh"] and "`profile.active_steps`，本次为 8" in text["zh"]
    assert "reaches into it" not in text["en"]  # 0.117 (0.116-0.119) lies wholly below 0.126-0.134


def test_a_traced_ratio_outside_where_one_more_process_would_fall_whose_interval_reaches_into_it_says_so() -> None:
    """The traced ratio 0.1175 (0.1163-0.1187) lies below where one more process would fall (0.1182-0.1338), its
    interval reaching into that range: still refused (by its value), and the item says the interval reaches in."""
    spread = tuple(0.122 + 0.0015 * i for i in range(6))
    [finding] = traced_scaling_differs(batch_pair(ratio=(0.12575, 0.122, 0.1295), processes=spread))
    text = rendered(finding)
    assert "95 %: 0.118–0.134), its value outside that range while its interval reaches into it" in text["en"]
    assert "其值落在该范围之外，但区间伸入该范围" in text["zh"]


def test_training_against_inference_is_explained_where_the_traced_ratio_falls_where_one_more_process_would() -> None:
    """The traced ratio, 36.7x (36.3-37.0), lies below the paired median's interval (37.5-43.5, six processes' range)
    but inside where one more process would fall (34.2-47.0): the update is named as why."""
    spread = (37.5, 38.0, 39.5, 40.5, 42.0, 43.5)
    [finding] = train_against_inference(modes_at(1, 5.0, 40.0, processes=spread))
    assert finding.message == "finding_train_update_explains"
    assert finding.values["traced_high"] < 37.5
    english = rendered(finding)["en"]
    assert "a training step took 40.00× an inference step (95 % CI 37.50–43.50, paired timing)" in english
    assert "The traced steps ran like the timed steps (36.67×, 95 % CI 36.27–37.05, lies where one more timing" in (
        english
    )
    assert "process would fall, 95 %: 34.20–47.04;" in english
    assert "the update is 99 % of the traced ratio's excess over it." in english
    assert "落在若再多跑一个计时进程其比值 95% 会落入的范围（34.20–47.04）内" in rendered(finding)["zh"]


def test_a_traced_ratio_whose_interval_only_touches_where_one_more_process_would_fall_explains_nothing() -> None:
    """The traced value, not just its interval, must lie where one more process would fall: a traced pass whose steps
    ran at two speeds can give an interval that reaches the prediction while its parts explain half again the timed
    change. Here one more process falls within 39.2-40.8 and the traced 40.9x (40.5-41.3) lies past it."""
    tight = (39.6, 39.8, 40.0, 40.0, 40.2, 40.4)
    [finding] = train_against_inference(modes_at(1, 5.63, 40.0, processes=tight))  # traced: 6.13 / 0.15
    assert finding.values["traced_low"] < finding.values["one_more_high"] < finding.values["traced_ratio"]
    assert finding.message == "finding_train_above_flops"


def test_training_against_inference_outside_where_one_more_process_would_fall_says_what_would_decide_it() -> None:
    tight = (39.6, 39.8, 40.0, 40.0, 40.2, 40.4)  # one more process within 39.2-40.8: the traced 36.7x misses it
    [finding] = train_against_inference(modes_at(1, 5.0, 40.0, processes=tight))
    assert finding.message == "finding_train_above_flops"
    text = rendered(finding)
    assert "lies outside where one more timing process would fall (95 %: 39.22–40.79)" in text["en"]
    assert "so the traced steps cannot say why" in text["en"]
    assert DECIDES_EN in text["en"] and "(`profile.active_steps`, 8 here)" in text["en"]
    assert DECIDES_ZH in text["zh"]


def test_the_untraced_steps_around_the_passes_say_whether_the_traced_steps_or_the_process_ran_apart() -> None:
    """The traced 36.7x misses where one more process would fall (39.2-40.8), but the steps the same processes ran
    untraced around the passes give 6.0 / 0.15 = 40x, inside it: the processes ran like the timed ones and their traced
    steps did not, so the finding gives the traced over untraced steps (no cause: training's ran faster) and timing
    without the profiler as what would decide it, not a rerun."""
    tight = (39.6, 39.8, 40.0, 40.0, 40.2, 40.4)
    data = modes_at(1, 5.0, 40.0, processes=tight)
    train, infer = data.records

    def around(untraced_ms: float, traced_ms: float) -> TraceCheck:
        return TraceCheck(
            traced_ms,
            untraced_ms * 0.9,
            untraced_ms * 1.1,
            1,
            untraced_steps_ms=(untraced_ms,) * STEPS,
            traced_steps_ms=(traced_ms,) * STEPS,
            expected_low_ms=untraced_ms * 0.9,
            expected_high_ms=untraced_ms * 1.1,
        )

    checked = AnalysisData.of(
        [
            dataclasses.replace(train, trace_check=around(6.0, 5.5)),
            dataclasses.replace(infer, trace_check=around(0.15, 0.15)),
        ],
        data.comparisons,
    )
    [finding] = train_against_inference(checked)
    assert finding.message == "finding_train_traced_apart"
    assert finding.values["untraced_ratio"] == pytest.approx(40.0)
    english, chinese = rendered(finding)["en"], rendered(finding)["zh"]
    assert "the steps the same processes ran untraced around the passes give 40.00×, inside it" in english
    assert "training's traced steps took 0.92× the untraced steps around them and inference's 1.00×" in english
    assert "timing that needs no profiler" in english and "quieter machine" not in english
    assert "同一进程在记录前后未记录的步骤给出 40.00 倍" in chinese and "更安静的机器" not in chinese
    assert "what made them differ is not measured" in english and "hooks" not in english
    assert "the profile stage now times it, and a rerun of `dvc repro profile@cpu` gives it." in english
    assert "not measured here" not in english and "（本次没有测量）" not in chinese
    # Without the untraced steps (an older record) the refusal stays the one that asks for another traced pass.
    [older] = train_against_inference(data)
    assert older.message == "finding_train_above_flops"
    # Untraced steps around the passes that miss as well (5.0 / 0.15 = 33x): the tracing process ran apart.
    apart = AnalysisData.of(
        [
            dataclasses.replace(train, trace_check=around(5.0, 5.5)),
            dataclasses.replace(infer, trace_check=around(0.15, 0.15)),
        ],
        data.comparisons,
    )
    [process] = train_against_inference(apart)
    assert process.message == "finding_train_process_apart"
    text = rendered(process)
    assert "the tracing process ran unlike the timing processes even untraced" in text["en"]
    assert "做性能分析的进程即使不记录，运行情况也与计时进程不同" in text["zh"]
    assert "a rerun of `dvc repro profile@cpu` gives it." in text["en"] and "not measured here" not in text["en"]
    assert "重新运行 `dvc repro profile@cpu` 即可得到" in text["zh"]


def test_the_updates_part_of_the_excess_is_all_of_it_where_without_it_the_ratio_would_not_exceed_the_flops() -> None:
    # traced: 0.3 + 5 + 0.01 ms against 0.15 ms, 35.4x; without the update 0.31 / 0.15 = 2.1x, below the FLOPs' 3x
    [finding] = train_against_inference(modes_at(1, 5.0, 35.0, outside_ms=0.01))
    assert finding.message == "finding_train_update_explains" and finding.values["without"] < 3.0
    text = rendered(finding)
    assert "so the update is all of its excess." in text["en"]
    assert "of the traced ratio's excess over it" not in text["en"]
    assert "超出部分全部来自优化器更新" in text["zh"]


# --- train_against_inference from the training step's parts (timed untraced beside it) --------------------------------

Interval = tuple[float, float, float]  # value, low, high


def with_training_parts(data: AnalysisData, batch: int, update: Interval, without: Interval) -> AnalysisData:
    """`data` with the training step's two parts at `batch` on the CPU, each a paired per-step ratio over six processes:
    the full step over the step without its update (U), and that step over inference (W)."""

    def part(numerator: str, denominator: str, found: Interval) -> PairedComparison:
        return PairedComparison(numerator, denominator, "step", *found, (found[0],) * 6)

    names = {mode: f"{batch}-cpu-{mode}" for mode in ("train", GRADIENTS, "inference")}
    parts = (
        part(names["train"], names[GRADIENTS], update),
        part(names[GRADIENTS], names["inference"], without),
    )
    comparisons = [dataclasses.replace(found, parts=found.parts + parts) for found in data.comparisons]
    return AnalysisData.of(data.records, comparisons)


def parts_at(ratio: float, update: Interval, without: Interval, optimizer_ms: float | None = None) -> AnalysisData:
    """Batch 1 (modes_at: FLOPs 3x, so 1.5x of them is 4.5x), paired train/inference `ratio` (±3 %) and the parts. The
    traced training step's update is `optimizer_ms`, by default the one that makes the traced ratio `ratio` (the traced
    pass then runs like the timed steps: 0.5 ms besides the update, inference 0.15 ms)."""
    update_ms = ratio * 0.15 - 0.5 if optimizer_ms is None else optimizer_ms
    return with_training_parts(modes_at(1, update_ms, ratio), 1, update, without)


def latin_in_chinese(finding: Finding) -> set[str]:
    text = re.sub(r"`[^`]*`", "", finding.render(load_catalogue("zh")))
    return set(re.findall(r"[A-Za-z][A-Za-z]*", text)) - ALLOWED_LATIN


def test_the_update_is_the_whole_excess_where_without_it_the_untraced_step_is_no_dearer_than_its_flops() -> None:
    """Paired 14x (13.6-14.4), above the FLOPs' 3x; untraced, the full step 4.8x (4.6-5.0) the step without its update
    (79 %, 78.3-80.0 % of the step) and that step 2.9x (2.7-2.98) inference, wholly at or below 3x: the update is the
    whole excess. The traced pass (2.1 / 0.15 = 14x) ran like the timed steps: its phases are a clause of their own."""
    [finding] = train_against_inference(parts_at(14.0, (4.8, 4.6, 5.0), (2.9, 2.7, 2.98)))
    assert finding.message == "finding_train_parts_update_explains"
    english, chinese = rendered(finding)["en"], rendered(finding)["zh"]
    assert "a training step took 14.00× an inference step (95 % CI 13.58–14.42, paired timing)" in english
    assert "the full training step took 4.80× the step without its Adadelta update" in english
    assert "(forward, backward and clearing the gradients; 95 % CI 4.60–5.00, paired timing)" in english
    assert "so leaving the update out saves 79.2 % of the training step's time (95 % CI 78.3–80.0 %;" in english
    said = "The step without the update took 2.90× an inference step (95 % CI 2.70–2.98, paired timing, untraced)"
    assert said in english
    assert "not above the FLOPs' ratio: the update is the whole excess." in english
    assert "The traced pass ran like the timed steps (14.00×" in english and "the Adadelta update 1.600 ms" in english
    assert "即去掉更新可省下训练一步耗时的 79.2%（95% 置信区间 78.3%–80.0%；" in chinese
    assert "不高于按 FLOPs 预计的比值：超出的部分全部来自更新" in chinese
    assert finding.cites["update_share"].low == pytest.approx(100 * (1 - 1 / 4.6))
    assert finding.cites["without_update_untraced"] == Measured(2.9, 2.7, 2.98, "paired timing")
    assert {"ratio", "update_factor", "traced_ratio", "optimizer"} <= set(finding.cites)
    for word in ("1.5", "bandwidth", "compute-bound"):
        assert word not in english


def test_the_update_is_part_of_the_excess_where_without_it_the_step_is_wholly_dearer_than_its_flops() -> None:
    """The project's batch 1 on its CPU, rounded: paired 14x, the full step 2.6x (2.5-2.8) the step without its update
    and that step 5.3x (5.0-5.9) inference, wholly above 3x: the update makes (14 - 5.3) / (14 - 3) = 79 % of the
    excess, the rest not apportioned. The traced pass (5.5 / 0.15 = 36.7x) ran unlike the timed steps: one clause
    says its parts are not used. The same holds at a ratio within 1.5x of the FLOPs (batch 64's 3.7x, 3.45x without
    the update: 35 % of the excess), where the rule once said nothing."""
    [finding] = train_against_inference(parts_at(14.0, (2.6, 2.5, 2.8), (5.3, 5.0, 5.9), optimizer_ms=5.0))
    assert finding.message == "finding_train_parts_more_than_update"
    english, chinese = rendered(finding)["en"], rendered(finding)["zh"]
    assert "so leaving the update out saves 61.5 % of the training step's time (95 % CI 60.0–64.3 %;" in english
    said = "Even the step without the update took 5.30× an inference step (95 % CI 5.00–5.90, paired timing, untraced)"
    assert said in english
    assert (
        "wholly above the FLOPs' ratio: from the medians, leaving the update out removes 79 % of the excess" in english
    )
    assert "these timings do not apportion the rest" in english
    assert "The traced pass's parts are not used: its ratio (36.67×" in english and "went to" not in english
    assert "即使去掉更新，这一步仍是推理一步的 5.30 倍（95% 置信区间 5.00–5.90，配对计时，未经性能分析）" in chinese
    assert "去掉更新可消除超出预计部分的约 79%" in chinese and "性能分析记录中的各部分未采用" in chinese
    assert "traced_ratio" not in finding.cites and "optimizer" not in finding.cites
    [near] = train_against_inference(parts_at(3.7, (1.06, 1.05, 1.08), (3.45, 3.44, 3.48)))
    assert near.message == "finding_train_parts_more_than_update" and near.values["excess"] == pytest.approx(
        100 * (3.7 - 3.45) / (3.7 - 3.0), rel=0.02
    )


def test_the_parts_do_not_decide_where_the_step_without_the_update_holds_the_flops_ratio() -> None:
    """Paired 14x, above 3x; the step without the update 3.1x (2.9-3.3), on both sides of 3x."""
    [finding] = train_against_inference(parts_at(14.0, (4.5, 4.3, 4.7), (3.1, 2.9, 3.3)))
    assert finding.message == "finding_train_parts_undecided_without"
    english = rendered(finding)["en"]
    assert (
        "The step without the update took 3.10× an inference step (95 % CI 2.90–3.30, paired timing, untraced), "
        in (english)
    )
    assert "an interval that holds the FLOPs' ratio, so whether any excess is left without the update the data " in (
        english
    )
    assert "区间包含按 FLOPs 预计的比值" in rendered(finding)["zh"]


def test_a_ratio_not_wholly_above_the_flops_states_the_parts_and_no_cause() -> None:
    """Paired 3.1x (2.9-3.3, six processes): not wholly above the FLOPs' 3x. The parts are stated, no cause."""
    data = modes_at(1, 0.0, 3.1, processes=(2.9, 3.0, 3.1, 3.1, 3.2, 3.3))
    [finding] = train_against_inference(with_training_parts(data, 1, (1.05, 1.03, 1.07), (2.9, 2.8, 3.0)))
    assert finding.message == "finding_train_parts_against_flops"
    english = rendered(finding)["en"]
    assert "its FLOPs predict 3.0×, and the ratio's interval does not lie wholly above that." in english
    assert "so leaving the update out saves 4.8 % of the training step's time (95 % CI 2.9–6.5 %;" in english
    assert "The step without the update took 2.90× an inference step (95 % CI 2.80–3.00" in english
    assert "explains" not in english and "more than" not in english


def test_every_parts_finding_reads_in_chinese_without_english_words() -> None:
    cases = [
        parts_at(14.0, (4.8, 4.6, 5.0), (2.9, 2.7, 2.98)),
        parts_at(14.0, (2.6, 2.5, 2.8), (5.3, 5.0, 5.9), optimizer_ms=5.0),
        parts_at(14.0, (4.5, 4.3, 4.7), (3.1, 2.9, 3.3)),
        with_training_parts(modes_at(1, 0.0, 2.9), 1, (1.05, 1.03, 1.07), (2.9, 2.8, 3.0)),
    ]
    found = [finding for data in cases for finding in train_against_inference(data)]
    assert {finding.message for finding in found} == PARTS_MESSAGES
    for finding in found:
        assert not latin_in_chinese(finding), (finding.message, latin_in_chinese(finding))


def test_a_traced_pass_set_aside_by_its_trace_check_is_one_clause_of_a_parts_finding() -> None:
    data = parts_at(14.0, (2.6, 2.5, 2.8), (5.3, 5.0, 5.9))
    set_aside = AnalysisData.of(data.records, data.comparisons)
    set_aside = dataclasses.replace(set_aside, traced={})  # as AnalysisData.of leaves a pass its trace check failed
    [finding] = train_against_inference(set_aside)
    assert finding.message == "finding_train_parts_more_than_update"
    english = rendered(finding)["en"]
    assert english.endswith("The traced pass of training, inference did not run like its timed steps (its trace "
                            "check), so its parts are not used.")  # fmt: skip


def test_a_record_without_both_parts_keeps_the_traced_rule_and_says_a_rerun_now_times_them() -> None:
    """An older record (no parts), or one with the update's factor only, or parts at another batch size: the traced
    pass decides as before, and a refusal says that rerunning the device's profile stage now times the step without the
    update."""
    older = modes_at(1, 5.0, 36.0)
    [finding] = train_against_inference(older)
    assert finding.message == "finding_train_update_explains"
    elsewhere = with_training_parts(older, 16, (2.6, 2.5, 2.8), (5.3, 5.0, 5.9))
    assert [f.message for f in train_against_inference(elsewhere)] == ["finding_train_update_explains"]
    comparisons = older.comparisons[0]
    one_part = dataclasses.replace(
        comparisons, parts=(PairedComparison("1-cpu-train", "1-cpu-gradients", "step", 2.6, 2.5, 2.8, (2.6,) * 6),)
    )
    assert [f.message for f in train_against_inference(AnalysisData.of(older.records, [one_part]))] == [
        "finding_train_update_explains"
    ]
    tight = (39.6, 39.8, 40.0, 40.0, 40.2, 40.4)
    [refused] = train_against_inference(modes_at(1, 5.0, 40.0, processes=tight))
    assert refused.message == "finding_train_above_flops"
    text = rendered(refused)
    assert (
        "A rerun of `dvc repro profile@cpu` now also times the step without the update beside the full step"
        in (text["en"])
    )
    assert "重新运行 `dvc repro profile@cpu` 现在也会" in text["zh"]


def saving_beyond_its_whole(large_conv_factor: float, spread: float) -> Finding:
    """Batch 1 and 64 of training: a 5 ms update and convolutions of 0.6 ms per sample at batch 1, `large_conv_factor`
    times that per sample at batch 64; the paired ratio agrees with the traced one."""
    small = with_parts(
        make_record(1, "cpu", "train", 6.0),
        {("optimizer", "optimizer"): 5.0, ("forward", "convolution"): 0.6},
        spread=spread,
    )
    large = with_parts(
        make_record(64, "cpu", "train", 45.0),
        {("optimizer", "optimizer"): 5.0, ("forward", "convolution"): 0.6 * 64 * large_conv_factor},
        spread=spread,
    )
    traced = (5.0 / 64 + 0.6 * large_conv_factor) / 5.6
    ratio = (traced, 0.97 * traced, 1.03 * traced, (traced,) * 6)
    data = AnalysisData.of([small, large], [make_comparisons("cpu", {("64-cpu-train", "1-cpu-train"): ratio})])
    [finding] = why_per_sample_changes(data)
    return finding


def test_a_share_of_a_saving_is_never_given_with_an_interval_past_100_percent() -> None:
    # Convolutions cost 50 % more per sample at batch 64: the update saved more than the whole net saving (its share
    # 106.3-106.7 %), which is said as such, never as a share past 100 %.
    beyond = saving_beyond_its_whole(1.5, 0.03)
    assert beyond.message == "finding_change_attributed_saved_against" and beyond.cites["optimizer"].low > 100
    [update] = beyond.values["groups"].items
    assert update["_message"] == "finding_share_item_all"
    text = rendered(beyond)
    assert "of the traced saving: the Adadelta update more than the whole change (its whole 95 % CI" in text["en"]
    assert "Adadelta 优化器更新超过整个变化量" in text["zh"]
    # Convolutions 8 % more per sample, steps spread ±30 %: the update's share 99.7-102.6 %, said as its lower end.
    straddles = saving_beyond_its_whole(1.08, 0.3)
    share = straddles.cites["optimizer"]
    assert share.low < 100 < share.high
    english = rendered(straddles)["en"]
    assert f"the Adadelta update at least {math.floor(share.low * 10) / 10:.1f} % (the upper end of its 95 % CI" in (
        english
    )
    # The parts not named (convolutions, under 2 % of the change) cost more per sample: a direction, not a share < 0.
    assert straddles.values["rest"] < 0 and "together moved the other way, by 1.0 % of the change" in english
    for finding in (beyond, straddles):
        for language, sentence in rendered(finding).items():
            shares = re.findall(r"(-?\d+\.\d) ?%", sentence)
            assert all(0 <= float(value) <= 100 for value in shares), (language, shares)


# --- memory_by_batch ------------------------------------------------------------------------------------------------


def with_memory(record: ProfileRecord, parts: dict[str, int]) -> ProfileRecord:
    peak = sum(parts.values())
    memory = StepMemory(peak, peak // 2, tuple(MemoryPart(n, b) for n, b in parts.items()), 0, peak, "", peak, peak, 6)
    return dataclasses.replace(record, memory=memory)


def test_memory_that_grows_with_the_batch_and_memory_that_does_not() -> None:
    small = with_memory(make_record(1, "cpu", "inference", 0.3), {"weights": 4_800_000, "activations": 234_000})
    large = with_memory(make_record(64, "cpu", "inference", 11.0), {"weights": 4_800_000, "activations": 18_874_000})
    [finding] = memory_by_batch(AnalysisData.of([small, large], []))
    text = rendered(finding)
    assert "grew with the batch: activations 0.234 → 18.9 MB; parts the same at both: weights 4.8 MB" in text["en"]
    assert "随批大小增长的部分：激活值 0.234 → 18.9 MB；两种批大小下相同的部分：权重 4.8 MB" in text["zh"]
    same = with_memory(make_record(64, "cpu", "inference", 11.0), {"weights": 4_800_000, "activations": 234_000})
    assert memory_by_batch(AnalysisData.of([small, same], [])) == []  # nothing grew: nothing to explain


# --- gpu_against_cpu ------------------------------------------------------------------------------------------------


def gpu_data(idle_large_ms: float) -> AnalysisData:
    cpu = [make_record(1, "cpu", "inference", 0.3), make_record(64, "cpu", "inference", 11.0)]
    gpu_small = with_parts(
        make_record(1, "cuda", "inference", 0.2), {("forward", "convolution"): 0.01, ("outside", "outside"): 0.19}
    )
    gpu_large = with_parts(
        make_record(64, "cuda", "inference", 0.25),
        {("forward", "convolution"): 0.05, ("outside", "outside"): idle_large_ms},
    )
    return AnalysisData.of([*cpu, gpu_small, gpu_large], [])


def test_the_gpu_speed_up_grows_because_its_idle_time_is_paid_per_step() -> None:
    [finding] = gpu_against_cpu(gpu_data(0.2))
    assert finding.values["speedup_small"] == pytest.approx(1.5)
    assert finding.values["speedup_large"] == pytest.approx(44)
    assert finding.values["idle_small"] == pytest.approx(95, abs=0.5)
    assert "GPU 在等待主机发射任务" in rendered(finding)["zh"]
    assert gpu_against_cpu(gpu_data(2.0)) == []  # the idle time grew 10x: not a per-step cost, no such reason


# --- training_against_profile ---------------------------------------------------------------------------------------


def test_training_speed_against_the_profile_names_the_differences_and_does_not_apportion_them() -> None:
    record = make_record(64, "cpu", "train", 40.0)  # 1600 samples/s, 2 threads, the profile's precision
    speed = {
        "images_per_second": 3200.0,
        "runtime": {"device": "cpu", "threads": 2, "precision": "bf16", "execution": "eager"},
    }
    [finding] = training_against_profile(AnalysisData.of([record], [], speed, 64))
    assert finding.values["ratio"] == pytest.approx(2.0)
    text = rendered(finding)["en"]
    assert (
        "precision (bf16 in training, fp32 in the profile)" in text
        and "threads" not in text.split("differ at least in")[1].split(",")[0]
    )
    assert "cannot say how much of the gap" in text
    assert "What would decide it: train stage runs that set these one at a time as the profile has them" in text
    assert "`train.threads`、`train.precision`、`train.execution`" in rendered(finding)["zh"]
    same = {"images_per_second": 1700.0, "runtime": {"device": "cpu", "threads": 2, "precision": "fp32"}}
    [finding] = training_against_profile(AnalysisData.of([record], [], same, 64))
    assert finding.message == "finding_training_same_settings"
    assert training_against_profile(AnalysisData.of([record], [], speed, 128)) == []  # batch 128 was not profiled
    busy = {**speed, "machine_busy": True, "cpu_share": 0.62}
    [finding] = training_against_profile(AnalysisData.of([record], [], busy, 64))
    assert "a machine busy while training (its threads got 62% of their CPUs)" in rendered(finding)["en"]


# --- every finding, every language ----------------------------------------------------------------------------------

ALLOWED_LATIN = {"CPU", "GPU", "CUDA", "MPS", "ms", "MB", "GFLOP", "s", "Adadelta", "ReLU", "dropout", "log", "softmax",
                 "FLOPs", "epoch", "bf16", "fp32"}  # fmt: skip


def test_the_chinese_analysis_has_no_english_words_outside_code_units_and_names() -> None:
    data = batch_pair()
    found = (
        findings(data)
        + train_against_inference(modes_at(1, 5.0, 20.0))
        + per_sample_direction(
            AnalysisData.of(
                data.records,
                [make_comparisons("cpu", {("64-cpu-train", "1-cpu-train"): (0.99, 0.9, 1.1, (0.99,) * 6)})],
            )
        )
    )
    assert len({finding.kind for finding in found}) >= 4
    for finding in found:
        text = re.sub(r"`[^`]*`", "", finding.render(load_catalogue("zh")))
        words = set(re.findall(r"[A-Za-z][A-Za-z]*", text))
        assert words <= ALLOWED_LATIN, (finding.message, words - ALLOWED_LATIN)


def test_on_the_h100_reference_the_gpu_speed_up_grows_because_the_gpu_waits_per_step() -> None:
    """The reference H100 run's traces (tests/data) split by the trace analysis: at batch 1 no kernel runs most of
    the traced step, and that wait hardly grows at batch 64, so the speed-up over the reference's CPU grows."""
    records = []
    for name in ("1-cpu-inference", "64-cpu-inference", "1-cuda-inference", "64-cuda-inference"):
        raw = json.loads((gpu_run_file(name, "profile.json")).read_text())
        metrics = record_metrics(raw)
        batch, device, mode = name.split("-")
        record = make_record(int(batch), device, mode, metrics["step_time_ms_median"])
        timing = dataclasses.replace(
            record.timing,
            step_time_ms_ci_low=metrics["step_time_ms_ci_low"],
            step_time_ms_ci_high=metrics["step_time_ms_ci_high"],
        )
        record = dataclasses.replace(record, timing=timing)
        if device == "cuda":
            trace = read_trace(gpu_run() / "traces" / device / f"{batch}-{mode}.json.gz")
            parts = analyse_trace(trace, "cuda").parts
            record = dataclasses.replace(record, analysis=dataclasses.replace(record.analysis, parts=parts))
        records.append(record)
    [finding] = gpu_against_cpu(AnalysisData.of(records, []))
    assert finding.values["idle_small"] > 50 and finding.values["speedup_large"] > finding.values["speedup_small"]
    assert finding.cites["idle_growth"].high < 64**0.25
    assert "the GPU waited for the host to launch work" in rendered(finding)["en"]


def test_a_combination_whose_traced_pass_ran_unlike_its_timed_steps_is_not_analysed() -> None:
    data = batch_pair()
    small, large = data.records
    outside = TraceCheck(traced_step_ms=30.0, timed_low_ms=44.0, timed_high_ms=46.0, attempts=3)
    data = AnalysisData.of([small, dataclasses.replace(large, trace_check=outside)], data.comparisons)
    assert large.combination not in data.traced
    assert why_per_sample_changes(data) == [] and per_step_or_per_sample(data) == []


def test_no_attribution_where_the_traced_ratio_disagrees_with_the_paired_one() -> None:
    # traced: 0.117x; paired 0.16 (0.15-0.17): the traced pass did not run like the timed steps
    assert why_per_sample_changes(batch_pair(ratio=(0.16, 0.15, 0.17))) == []


def test_a_busy_training_machine_is_a_difference_only_where_the_profile_was_not_busy_too() -> None:
    speed = {"images_per_second": 3200.0, "machine_busy": True, "cpu_share": 0.6, "runtime": {"threads": 1}}
    quiet, busy = make_record(64, "cpu", "train", 40.0, load=0.5), make_record(64, "cpu", "train", 40.0, load=3.0)
    [said] = training_against_profile(AnalysisData.of([quiet], [], speed, 64))
    [unsaid] = training_against_profile(AnalysisData.of([busy], [], speed, 64))
    assert "busy" in rendered(said)["en"] and "busy" not in rendered(unsaid)["en"]


def test_time_outside_operators_is_not_named_where_the_profilers_hooks_may_be_all_of_it() -> None:
    """Batch 1's traced steps run 0.3 ms over the untraced ones around them, more than its 0.2 ms outside operators:
    that time may be the hooks', so the saving is attributed without it."""
    data = batch_pair()
    small, large = data.records
    steps = tuple(5.8 + 0.01 * (i % 3) for i in range(STEPS))
    hooked = TraceCheck(5.8, 5.0, 6.0, 1, untraced_steps_ms=tuple(t - 0.3 for t in steps), traced_steps_ms=steps)
    data = AnalysisData.of([dataclasses.replace(small, trace_check=hooked), large], data.comparisons)
    assert data.traced[small.combination].hooks_cover_outside()
    [finding] = why_per_sample_changes(data)
    assert [item["group"].key for item in finding.values["groups"].items] == ["group_optimizer"]
    [fixed] = said(per_step_or_per_sample(data), "finding_fixed_per_step")
    assert [item["group"].key for item in fixed.values["groups"].items] == ["group_optimizer"]


def test_a_memory_part_held_at_one_peak_only_is_not_said_to_grow() -> None:
    """Batch 1's peak falls in the optimizer's update (its temporaries, no activations), batch 64's in the backward
    pass: activations from 0 are a moved peak, not growth; the inputs grew from 3 kB."""
    small = with_memory(
        make_record(1, "cpu", "train", 6.0), {"weights": 4_800_000, "inputs": 3_144, "optimizer temporaries": 9_400_000}
    )
    large = with_memory(
        make_record(64, "cpu", "train", 45.0), {"weights": 4_800_000, "inputs": 201_000, "activations": 15_000_000}
    )
    [finding] = memory_by_batch(AnalysisData.of([small, large], []))
    assert [item["part"].key for item in finding.values["grows"].items] == ["memory_inputs"]
    moved = [item["part"].key for item in finding.values["moved"].items]
    assert moved == ["memory_optimizer_temporaries", "memory_activations"] or set(moved) == {
        "memory_optimizer_temporaries",
        "memory_activations",
    }


# --- update_per_step: the update's time per step, timed without a profiler --------------------------------------------


def update_lab(large_update_ms: float) -> AnalysisData:
    """Training at batch 1 and 64, six timing processes each: steps of 6 and 45 ms (±1 % from process to process),
    the update 5 ms of batch 1's step and `large_update_ms` of batch 64's in every process (the full step over the step
    without the update, U, set to match)."""
    records, data_parts = [], {}
    for batch, step_ms, update_ms in ((1, 6.0, 5.0), (64, 45.0, large_update_ms)):
        steps = tuple(step_ms * (1 + 0.01 * (k - 2.5) / 2.5) for k in range(6))
        factors = tuple(ms / (ms - update_ms) for ms in steps)  # each process's U: its update is update_ms
        record = dataclasses.replace(training(batch, step_ms, update_ms, 0.3), process_step_times_ms=steps)
        records += [record, inference(batch, step_ms / 4, 0.1)]
        data_parts[batch] = factors
    data = AnalysisData.of(records, [make_comparisons("cpu", {})])
    for batch, factors in data_parts.items():
        u = (statistics.median(factors), min(factors), max(factors))
        data = with_training_parts(data, batch, u, (3.0, 2.9, 3.1))
        comparisons = data.comparisons[0]
        parts = tuple(
            dataclasses.replace(c, process_values=factors) if c.numerator == f"{batch}-cpu-train" else c
            for c in comparisons.parts
        )
        data = AnalysisData.of(data.records, [dataclasses.replace(comparisons, parts=parts)])
    return data


def test_the_update_timed_without_a_profiler_is_a_cost_per_step_where_it_hardly_grows_with_the_batch() -> None:
    """The update takes 5 ms of every process's step at both batch sizes: 1.00x, wholly below 64^0.25 = 2.83x, so it is
    paid per step and per sample falls from 5 to 5/64 = 0.078 ms. Taking 20 ms at batch 64 (4x) it is not classed."""
    [finding] = update_per_step(update_lab(5.0))
    assert finding.message == "finding_update_per_step"
    assert finding.values["small_ms"] == pytest.approx(5.0) and finding.values["large_ms"] == pytest.approx(5.0)
    assert finding.values["growth"] == pytest.approx(1.0)
    english = rendered(finding)["en"]
    assert (
        "leaving the update out saved 5.00 ms per step at batch 1 (95 % CI 5.00–5.00) and 5.00 ms at batch 64"
        in english
    )
    assert "wholly below 2.83× (the batch ratio's fourth root)" in english
    assert "per sample it fell from 5.000 ms to 0.0781 ms" in english
    assert "分摊到每个样本上，它从 5.000 ms 降到 0.0781 ms" in rendered(finding)["zh"]
    [grows] = update_per_step(update_lab(20.0))
    assert grows.message == "finding_update_not_classed" and grows.values["growth"] == pytest.approx(4.0)
    assert "do not class the saving as paid per step" in rendered(grows)["en"]
    # A record without parts, or without each process's step time, gives no finding.
    assert update_per_step(modes_at(1, 5.0, 36.0)) == []


def excess_lab(large_inference_ms: float) -> AnalysisData:
    """Training and inference at batch 1 and 64, six processes each: inference steps of 0.5 ms and
    `large_inference_ms` (±1 %), the step without the update 5.6x (batch 1) and 3.45x (batch 64) inference in every
    process, against a FLOP ratio of 3."""
    records = []
    for batch, infer_ms in ((1, 0.5), (64, large_inference_ms)):
        steps = tuple(infer_ms * (1 + 0.01 * (k - 2.5) / 2.5) for k in range(6))
        records += [
            training(batch, 10 * infer_ms, 1.0, 0.3),
            dataclasses.replace(inference(batch, infer_ms, 0.1), process_step_times_ms=steps),
        ]
    data = AnalysisData.of(records, [make_comparisons("cpu", {})])
    for batch, w in ((1, 5.6), (64, 3.45)):
        data = with_training_parts(data, batch, (1.2, 1.1, 1.3), (w, w * 0.99, w * 1.01))
    return data


def test_the_excess_without_the_update_is_classed_by_its_time_per_step_not_by_the_shrinking_ratio() -> None:
    """The ratio without the update falls from 5.6x to 3.45x, toward the FLOPs' 3x. Per step its excess is the
    inference step's time times W - 3: 0.5 x 2.6 = 1.3 ms at batch 1; with a 20 ms inference step at batch 64, 9.0 ms
    (6.9x, between 64^0.25 and 64^0.75: grows more slowly than the samples, not a cost per step); with a 4 ms one,
    1.8 ms (1.38x: a cost per step). The audit found the first case called a cost per step from the ratio alone."""
    [between] = excess_without_update(excess_lab(20.0))
    assert between.message == "finding_excess_without_update_between"
    assert between.values["e_small"] == pytest.approx(1.3) and between.values["e_large"] == pytest.approx(9.0)
    english = rendered(between)["en"]
    assert "took 1.30 ms at batch 1 (95 % CI" in english and "and 9.00 ms at batch 64" in english
    assert "6.92× (95 % CI" in english and "yet it is not a cost paid per step alone" in english
    assert "a hypothesis, not measured here" in english
    assert not latin_in_chinese(between)
    [fixed] = excess_without_update(excess_lab(4.0))
    assert fixed.message == "finding_excess_without_update_per_step"
    assert "wholly below 2.83× (the batch ratio's fourth root): a cost paid per step" in rendered(fixed)["en"]
    assert not latin_in_chinese(fixed)


def test_the_updates_traffic_is_a_likely_pace_only_where_its_saving_lies_between_one_and_two_times_that_traffic() -> (
    None
):
    """139 MB per step against a 5 ms saving: at 23.7 GB/s they take 5.9 ms, more than the saving (DRAM could not have
    supplied them: the caches held part); at 40 GB/s 3.5 ms (the saving within twice that: a likely pace); at 100
    GB/s 1.4 ms (no pace said)."""
    said = {}
    for bandwidth in (23.7, 40.0, 100.0):
        data = update_lab(5.0)
        records = [
            dataclasses.replace(
                r,
                analysis=dataclasses.replace(
                    r.analysis,
                    flop_rate=dataclasses.replace(
                        r.analysis.flop_rate, update_bytes_per_step=139e6, bandwidth_gb_per_s=bandwidth
                    ),
                ),
            )
            for r in data.records
        ]
        [finding] = update_per_step(AnalysisData.of(records, data.comparisons))
        said[bandwidth] = (finding.values["traffic"].message, rendered(finding))
    assert said[23.7][0] == "finding_update_traffic_cached"
    assert "that is 5.9 ms of traffic, more than the 5.0 ms that leaving it out saves" in said[23.7][1]["en"]
    assert said[40.0][0] == "finding_update_traffic_paced" and "a likely pace" in said[40.0][1]["en"]
    assert said[100.0][0] == "finding_update_traffic" and "pace" not in said[100.0][1]["en"]
    assert all("STREAM" in text["zh"] and "GB/s" in text["zh"] for _, text in said.values())
