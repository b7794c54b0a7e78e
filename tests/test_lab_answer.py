"""What the report says of each kind of evidence: every sentence and flag follows from the numbers it cites.

Table-driven: records and paired comparisons built in memory for each kind of sentence, including the four
contradictions of the Zen 5 report of 2926700 (a drift flag on every row; a paired rise read as "no measurable
difference"; an operator table from a pass slower than the timed step; "memory-bound" from a lower bound on
intensity), and what the report must (and must not) say of each.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from pipeline.profiling.processes import WorkerResult, combine
from pipeline.profiling.worker import WorkerSpec
from pipeline.records.profile import OperatorRow, ProfileRecord, TraceCheck
from pipeline.records.quantities import Interval, MeasurementConditions, StepMemory, StepPart
from pipeline.records.statistics import PROCESSES_DISAGREE_ADVICE, Block, prediction_interval
from pipeline.records.wording import (
    disagreement_said,
    measurement_warnings,
    operators_markdown,
    process_speed_sentence,
    ratio_table,
    stage_warnings,
)
from pipeline.report.catalogue import load_catalogue
from pipeline.report.comparison import comparison_markdown, comparison_rows
from pipeline.report.findings import AnalysisData, per_sample_direction
from pipeline.report.roofline import NEAR_RIDGE, RooflinePoint, roofline_markdown
from tests.helpers.records import make_comparisons, make_record

SIX = 6


def _inference(per_sample: dict[int, float], ci_pct: float = 1.0, device: str = "cpu") -> list[ProfileRecord]:
    return [
        make_record(batch, device, "inference", ms * batch, (("aten::mkldnn_convolution", 40.0),), ci_pct=ci_pct)
        for batch, ms in per_sample.items()
    ]


BATCH_CASES = [
    pytest.param(
        # The Zen 5 case: six processes at batch 64 all above six at batch 16, per sample ~7 % dearer.
        {1: 1.20, 16: 0.1471, 64: 0.1573},
        {
            ("16-cpu-inference", "1-cpu-inference"): (
                0.1226,
                0.1210,
                0.1240,
                (0.122, 0.123, 0.121, 0.124, 0.122, 0.123),
            ),
            ("64-cpu-inference", "16-cpu-inference"): (1.070, 1.055, 1.085, (1.06, 1.07, 1.08, 1.07, 1.06, 1.08)),
            ("64-cpu-inference", "1-cpu-inference"): (0.131, 0.129, 0.133, (0.13, 0.131, 0.132, 0.13, 0.131, 0.133)),
        },
        {(1, 16): "finding_per_sample_falls", (16, 64): "finding_per_sample_rises"},
        [
            "batch 1 → 16**: the time per sample fell to 0.123× (95 % CI 0.121–0.124, paired timing)",
            "batch 16 → 64**: the time per sample rose to 1.070× (95 % CI 1.055–1.085, paired timing)",
        ],
        ["cannot tell", "levels off", "fixed per-step costs"],
        id="paired-rise-16-to-64",
    ),
    pytest.param(
        {1: 1.20, 16: 0.150, 64: 0.151},
        {
            ("16-cpu-inference", "1-cpu-inference"): (0.125, 0.123, 0.127, (0.125,) * SIX),
            ("64-cpu-inference", "16-cpu-inference"): (1.004, 0.990, 1.020, (0.99, 1.01, 1.0, 1.02, 0.995, 1.005)),
            ("64-cpu-inference", "1-cpu-inference"): (0.126, 0.124, 0.128, (0.126,) * SIX),
        },
        {(1, 16): "finding_per_sample_falls", (16, 64): "finding_per_sample_undecided"},
        [
            "batch 16 → 64**: the data cannot tell whether the time per sample changed (1.004×, 95 % CI 0.990–1.020 "
            "includes 1)"
        ],
        ["rose"],
        id="tie-cannot-decide",
    ),
    pytest.param(
        {1: 1.20, 16: 0.30, 64: 0.15},
        {
            ("16-cpu-inference", "1-cpu-inference"): (0.25, 0.24, 0.26, (0.25,) * SIX),
            ("64-cpu-inference", "16-cpu-inference"): (0.50, 0.49, 0.51, (0.5,) * SIX),
            ("64-cpu-inference", "1-cpu-inference"): (0.125, 0.12, 0.13, (0.125,) * SIX),
        },
        {(1, 16): "finding_per_sample_falls", (16, 64): "finding_per_sample_falls"},
        ["batch 16 → 64**: the time per sample fell to 0.500× (95 % CI 0.490–0.510"],
        ["rose", "cannot tell"],
        id="monotone-fall",
    ),
    pytest.param(
        # An H100 run (cuda inference, host-bound): ratios far below 1, each interval clear of 1.
        {1: 0.2081, 16: 0.0136, 64: 0.0036},
        {
            ("16-cuda-inference", "1-cuda-inference"): (
                0.063533,
                0.062356,
                0.063859,
                (0.0634727, 0.0638585, 0.0623563, 0.0635935, 0.0629669, 0.063612),
            ),
            ("64-cuda-inference", "16-cuda-inference"): (
                0.272362,
                0.270582,
                0.275311,
                (0.270582, 0.27372, 0.275311, 0.272315, 0.272409, 0.271423),
            ),
            ("64-cuda-inference", "1-cuda-inference"): (
                0.017241,
                0.017187,
                0.017428,
                (0.0172532, 0.0174283, 0.0172144, 0.0172285, 0.0173416, 0.017187),
            ),
        },
        {(1, 16): "finding_per_sample_falls", (16, 64): "finding_per_sample_falls"},
        ["batch 16 → 64**: the time per sample fell to 0.272× (95 % CI 0.271–0.275"],
        ["rose", "cannot tell"],
        id="ratios-far-below-1",
    ),
]


@pytest.mark.parametrize(("per_sample", "ratios", "directions", "says", "never"), BATCH_CASES)
def test_batch_findings_follow_the_paired_ratios(
    per_sample: dict[int, float],
    ratios: dict[tuple[str, str], tuple[float, float, float, tuple[float, ...]]],
    directions: dict[tuple[int, int], str],
    says: list[str],
    never: list[str],
) -> None:
    """Each batch size against the next, a direction only where the paired ratio's interval excludes 1 (the Zen 5
    report read a paired rise as "no measurable difference")."""
    device = next(iter(ratios))[0].split("-")[1]
    data = AnalysisData.of(_inference(per_sample, device=device), [make_comparisons(device, ratios)])
    found = per_sample_direction(data)
    assert {(f.values["small"], f.values["large"]): f.message for f in found} == directions
    text = " ".join(finding.render(load_catalogue("en")) for finding in found)
    for words in says:
        assert words in text, text
    for words in never:
        assert words not in text, text


def test_the_ratio_table_prints_a_small_ratio_and_its_interval_apart() -> None:
    found = make_comparisons(
        "cuda",
        {("64-cuda-inference", "1-cuda-inference"): (0.017241, 0.017087, 0.017428, (0.01725, 0.01709, 0.01743))},
    )
    row = ratio_table(found.comparisons)[2]
    assert row.startswith("| 64-cuda-inference / 1-cuda-inference | sample | 0.0172 | 0.0171-0.0174 | ±1.1 |"), row


def _analysed(record: ProfileRecord) -> bool:
    """The findings read `record`'s traced pass (given traced parts to read): only where it ran like the timed step."""
    parts = (StepPart("forward", "convolution", tuple(0.5 + 0.01 * (step % 3) for step in range(30))),)
    traced = dataclasses.replace(record, analysis=dataclasses.replace(record.analysis, parts=parts))
    return traced.combination in AnalysisData.of([traced], []).traced


def _with_trace(record: ProfileRecord, traced_ms: float) -> ProfileRecord:
    timing = record.timing
    check = TraceCheck(traced_ms, timing.step_time_ms_ci_low, timing.step_time_ms_ci_high, attempts=3)
    return dataclasses.replace(record, trace_check=check)


FLAG_CASES = [
    # (what the row's own data show, the flag in the table, a phrase of the warning; None: no warning at all)
    pytest.param(dict(ci_pct=1.5), "", None, id="processes-agree-no-flag-whatever-the-drift"),
    pytest.param(dict(ci_pct=6.0), "processes disagree", "processes disagree: its 6 timing processes", id="disagree"),
    pytest.param(dict(ci_pct=17.9, processes=2), "too few processes", "too few processes: its 2", id="too-few"),
    pytest.param(dict(ci_pct=1.5, traced=13.65), "table not the timed step", "the operator table is not", id="trace"),
    pytest.param(dict(ci_pct=1.5, load=3.0), "busy", "the machine was busy while measuring", id="busy"),
]


@pytest.mark.parametrize(("evidence", "flag", "warning"), FLAG_CASES)
def test_a_row_is_flagged_only_for_what_its_own_data_show(
    evidence: dict[str, float], flag: str, warning: str | None
) -> None:
    record = make_record(
        64,
        "cpu",
        "inference",
        10.07,
        (("aten::clamp_min", 26.7),),
        ci_pct=evidence["ci_pct"],
        load=evidence.get("load", 0.5),
    )
    medians = (9.6, 9.9, 10.0, 10.1, 10.3, 10.6)
    record = dataclasses.replace(record, process_step_times_ms=medians[: int(evidence.get("processes", len(medians)))])
    if "traced" in evidence:
        record = _with_trace(record, evidence["traced"])
    (row,) = comparison_rows([record])
    assert row.flags() == flag
    warnings = measurement_warnings(record)
    if warning is None:
        assert warnings == []
        assert len(comparison_markdown([row]).split("\n\n")) == 2  # the table and what its numbers are: no flag note
    else:
        assert len(warnings) == 1 and warning in warnings[0], warnings


def test_a_flag_every_row_raises_is_said_once_with_each_rows_spread() -> None:
    # As on an H100 host: every row's own spread (±2.3-8.7 %) beyond the ±2 % target.
    records = [
        make_record(batch, "cuda", "inference", ms, (("aten::addmm", 40.0),), ci_pct=pct)
        for batch, ms, pct in ((1, 0.208, 8.7), (16, 0.217, 5.3), (64, 0.229, 5.2))
    ]
    rows = comparison_rows(records)
    table = comparison_markdown(rows)
    assert [line.rsplit("|", 2)[1] for line in table.splitlines()[2:5]] == ["  "] * 3  # no flag on any row
    assert (
        "**Processes disagree**, in every row (1-cuda-inference ±8.7 %, 16-cuda-inference ±5.3 %, 64-cuda-inference "
        "±5.2 %): beyond the speed all combinations shared in each timing process, each row's processes still spread "
        "this wide, more than `profile.ci_target_pct` (±2 %); this machine held no combination to it, so it is said "
        "here once, not on each row; raise `profile.processes`"
    ) in table
    one_agrees = comparison_markdown(comparison_rows([*records[:2], make_record(64, "cuda", "inference", 0.229, ())]))
    assert one_agrees.count("| processes disagree |") == 2 and "in every row" not in one_agrees


def test_the_stage_says_processes_disagreeing_in_every_combination_once_with_each_ones_spread() -> None:
    # As profile@cuda printed on an H100 host: six warnings alike, one per combination.
    def disagreeing(batch: int, mode: str, ms: float, own_pct: float) -> ProfileRecord:
        record = make_record(batch, "cuda", mode, ms, ci_pct=own_pct + 3)
        return dataclasses.replace(
            record,
            timing=dataclasses.replace(record.timing, own_ci_pct=own_pct),
            process_step_times_ms=tuple(ms * (1 + k / 20) for k in range(6)),
        )

    records = [disagreeing(1, "inference", 0.211, 11.5), disagreeing(1, "train", 1.895, 7.3)]
    warnings = stage_warnings(records)
    assert warnings == [
        "processes disagree in every combination (1-cuda-inference ±11.5 %, 1-cuda-train ±7.3 %): beyond the speed "
        "all combinations shared in each timing process, each one's processes still spread wider than the ±2 % "
        f"`profile.ci_target_pct`; {PROCESSES_DISAGREE_ADVICE}"
    ], warnings
    agreeing = make_record(16, "cuda", "inference", 0.209, ci_pct=1.5)
    one_agrees = stage_warnings([*records, agreeing])
    assert len(one_agrees) == 2 and all(": processes disagree: its 6 timing processes" in w for w in one_agrees)
    assert [w.split(":")[0] for w in one_agrees] == ["1-cuda-inference", "1-cuda-train"]


def test_disagreeing_processes_are_warned_of_only_where_a_paired_ratio_is_undecided() -> None:
    """As the report's comparison table flags them (docs/analysis.md): the stage's console and each operator table
    name disagreeing processes only on a combination in a paired ratio whose interval holds 1: with every ratio
    decided, no operator table warns, as the comparison table flags no row."""
    from pipeline.records.profile import DeviceComparisons, PairedComparison

    def disagreeing(batch: int, ms: float, own_pct: float) -> ProfileRecord:
        record = make_record(batch, "cpu", "inference", ms, ci_pct=own_pct + 3)
        return dataclasses.replace(
            record,
            timing=dataclasses.replace(record.timing, own_ci_pct=own_pct),
            process_step_times_ms=tuple(ms * (1 + k / 20) for k in range(6)),
        )

    records = [disagreeing(1, 0.5, 13.9), disagreeing(16, 2.0, 3.6), disagreeing(64, 7.0, 5.2)]
    names = [record.combination.name for record in records]

    def ratio(numerator: int, denominator: int, low: float, high: float) -> PairedComparison:
        return PairedComparison(names[numerator], names[denominator], "sample", (low + high) / 2, low, high, ())

    decided = DeviceComparisons("cpu", 6, (ratio(1, 0, 0.2, 0.3), ratio(2, 1, 0.8, 0.9), ratio(2, 0, 0.1, 0.2)))
    assert decided.undecided_names() == frozenset()
    assert not [w for w in stage_warnings(records, decided) if "disagree" in w]
    matters, every = disagreement_said(records, decided)
    assert matters == frozenset() and not every
    assert "disagree" not in operators_markdown(records[0], every, names[0] in matters)

    one_open = dataclasses.replace(decided, comparisons=(ratio(1, 0, 0.9, 1.1), *decided.comparisons[1:]))
    warned = [w.split(":")[0] for w in stage_warnings(records, one_open) if "processes disagree" in w]
    assert warned == names[:2]  # the two in the undecided ratio, not batch 64
    matters, every = disagreement_said(records, one_open)
    assert "processes disagree" in operators_markdown(records[0], every, names[0] in matters)
    assert "processes disagree" not in operators_markdown(records[2], every, names[2] in matters)
    # Without the paired comparisons (an older record), every disagreeing row is named, said once for all.
    assert stage_warnings(records)[0].startswith("processes disagree in every combination")


def test_two_agreeing_processes_are_flagged_as_too_few_not_as_disagreeing() -> None:
    record = dataclasses.replace(
        make_record(1, "cpu", "inference", 0.56, ci_pct=17.9), process_step_times_ms=(0.553, 0.567)
    )
    (warning,) = measurement_warnings(record)
    assert warning.startswith("too few processes: its 2 timing processes settled at 0.553-0.567 ms (2.5 % apart)")
    assert "`profile.processes: 6` or more" in warning

    # Every row so (the tiny params' 2 processes): the stage, the report's flags and its notes all name that cause.
    other = dataclasses.replace(
        make_record(64, "cpu", "inference", 9.9, ci_pct=40.6), process_step_times_ms=(9.7, 10.2)
    )
    assert not any("disagree" in warning for warning in stage_warnings([record, other]))
    rows = comparison_rows([record, other])
    assert [row.flags() for row in rows] == ["too few processes"] * 2
    table = comparison_markdown(rows)
    assert "**Processes disagree**" not in table and "| processes disagree" not in table
    assert (
        "**Too few processes** (1-cpu-inference ±17.9 % from 2, 64-cpu-inference ±40.6 % from 2): each of these "
        "intervals comes from fewer than 6 timing processes, too few for a distribution-free interval of the median, "
        "and is wider than `profile.ci_target_pct` (±2 %): it says how little so few processes pin the median down, "
        "not that they disagree; `profile.processes: 6` or more gives a distribution-free interval."
    ) in table
    # One row with 6 disagreeing processes beside them: flagged and noted as disagreeing, not "in every row".
    six = dataclasses.replace(
        make_record(16, "cpu", "inference", 2.0, ci_pct=6.0), process_step_times_ms=(1.8, 1.9, 2.0, 2.0, 2.1, 2.3)
    )
    mixed = comparison_markdown(comparison_rows([record, six, other]))
    assert mixed.count("| too few processes |") == 2 and mixed.count("| processes disagree |") == 1
    assert "**Processes disagree** (16-cpu-inference ±6.0 %)" in mixed and "in every row" not in mixed


def test_an_operator_table_off_the_timed_step_says_so_and_is_not_quoted() -> None:
    """64-cpu-inference of the Zen 5 report: traced 13.65 ms against a timed 10.07 ms (CI 9.61-10.58)."""
    record = make_record(64, "cpu", "inference", 10.07, (("aten::clamp_min", 26.7),), ci_pct=5.0)
    record = dataclasses.replace(
        record, timing=dataclasses.replace(record.timing, step_time_ms_ci_low=9.61, step_time_ms_ci_high=10.58)
    )
    off = _with_trace(record, 13.65)
    table = operators_markdown(off)
    assert (
        "**Warning:** the operator table is not the timed step: the traced step took 13.650 ms, 29.0 % above the "
        "timed step's 95 % CI (9.610-10.580 ms; 3 passes traced)" in table
    )
    assert table.count("13.650 ms") == 1  # said once, as the row's warning
    assert "share is of the traced step's operator time" in table
    assert not _analysed(off)
    inside = _with_trace(record, 10.2)
    assert "The table's pass ran at the timed speed: the traced step took 10.200 ms, inside" in operators_markdown(
        inside
    )
    assert _analysed(inside)


def _point(name: str, intensity: float, achieved: float) -> RooflinePoint:
    return RooflinePoint("cpu", "inference", 64, name, intensity, Interval(achieved, achieved, achieved), 200.0, 40.0)


def test_a_lower_bound_on_intensity_proves_compute_bound_and_never_memory_bound() -> None:
    """Ridge 5 FLOP/byte. Left of it the counted (lower-bound) intensity decides nothing; right of it, compute-bound."""
    left, right = _point("aten::addmm", 2.0, 177.2), _point("aten::mkldnn_convolution", 12.0, 150.0)
    near = _point("aten::mm", 7.0, 150.0)
    assert near.bound == NEAR_RIDGE  # 1.4x the ridge: re-reads could move it left
    assert left.bound != "memory-bound" and right.bound == "compute-bound"
    text = roofline_markdown([left, right])
    assert "memory-bound" not in text.lower()
    assert "Left of the ridge at their counted intensity, not decided: `aten::addmm`" in text
    assert "Compute-bound at their counted intensity" in text and "more than 2.4x" in text  # 12 / 5 FLOP/byte
    assert "only measured DRAM traffic (hardware counters) could show which of them DRAM's bandwidth bounds" in text
    # Above the memory roof (177.2 of 80 GFLOP/s) is said with what the triad roof does not count, no cause chosen.
    assert "`aten::addmm` (inference batch 64: 222 % of its roof" in text
    assert "Which of these holds is not measured here" in text and "does not limit these" not in text


BASE_MS = (1.0, 8.0, 20.0, 60.0)  # four combinations' step times


def _worker(speed: float, own: tuple[float, ...]) -> WorkerResult:
    """A timing process that ran every combination at `speed` (the machine's), each with its own extra factor."""
    conditions = MeasurementConditions(0.5, 0.5, cores=2, threads=1, cpu_governor="not exposed")
    items = tuple(
        tuple(Block(10, 10 * base * speed * factor / 1000) for _ in range(20))
        for base, factor in zip(BASE_MS, own, strict=True)
    )
    memory = StepMemory(1_000_000, 500_000, (), 0, 0, "", 1_000_000, 1_000_000)
    return WorkerResult(items, 1.0, conditions, (memory,) * len(items), ())


def test_processes_that_moved_together_flag_no_row_and_the_speed_is_said_once() -> None:
    """The machine ran each whole process at its own speed (up to 12 % apart), every combination alike: each row's
    interval holds that (it is wide) but no row is flagged for it; the paired ratio cancels it."""
    items = ((1, "inference"), (16, "inference"), (1, "train"), (16, "train"))
    spec = WorkerSpec("model.pt", "data", "cpu", items, 1, 3, 2.0, 6.0)
    speeds = (1.0, 1.12, 1.05, 0.98, 1.08, 1.02)
    paired = combine([_worker(speed, (1.0,) * 4) for speed in speeds], spec)
    for timing in paired.timings:
        record = timing.record()
        assert record.step_time_ci_pct > 4.0 and record.own_ci_pct == pytest.approx(0.0, abs=1e-9)
        assert not record.noisy
    assert max(paired.speeds) / min(paired.speeds) == pytest.approx(1.12 / 0.98)
    # One combination that also disagrees on its own (the fifth process 10 % slower at batch 16 only): flagged.
    own = [(1.0,) * 4] * 4 + [(1.0, 1.10, 1.0, 1.0), (1.0,) * 4]
    skewed = combine([_worker(speed, factors) for speed, factors in zip(speeds, own, strict=True)], spec)
    assert [timing.record().noisy for timing in skewed.timings] == [False, True, False, False]
    found = make_comparisons("cpu", {("16-cpu-inference", "1-cpu-inference"): (0.5, 0.49, 0.51, (0.5,) * SIX)})
    sentence = process_speed_sentence(dataclasses.replace(found, process_speeds=paired.speeds))
    assert sentence.startswith(
        "Between its 6 timing processes the cpu ran up to 14.3 % apart in the speed its combinations shared"
    )


def _traced_in_process(
    record: ProfileRecord,
    untraced_ms: float,
    traced_ms: float,
    operators: tuple[tuple[str, float, float], ...],
    calls_per_step: float = 20,
) -> ProfileRecord:
    """A format-9 trace check: 31 untraced steps around 30 traced ones (each set spread ±1 %), held against the
    prediction from the record's timing processes; (operator, share %, calls) rows whose self times are their share of
    an operator time of 90 % of the traced step, which makes `calls_per_step` operator calls."""
    untraced = tuple(untraced_ms * (1 + (i - 15) / 1500) for i in range(31))
    traced = tuple(traced_ms * (1 + (i - 15) / 1500) for i in range(30))
    expected = prediction_interval(record.process_step_times_ms)
    assert expected is not None
    timing = record.timing
    check = TraceCheck(
        statistics.median(traced),
        timing.step_time_ms_ci_low,
        timing.step_time_ms_ci_high,
        1,
        untraced,
        traced,
        *expected,
    )
    operator_ms = 0.9 * traced_ms
    rows = tuple(
        OperatorRow(name, calls, operator_ms * share / 100, operator_ms * share / 100, None, None, share, None)
        for name, share, calls in operators
    )
    anatomy = dataclasses.replace(record.analysis.anatomy, operator_calls_per_step=calls_per_step)
    analysis = dataclasses.replace(record.analysis, anatomy=anatomy)
    return dataclasses.replace(record, trace_check=check, top_operators=rows, analysis=analysis)


def _batch_one() -> ProfileRecord:
    """Batch-1 inference timed at 0.509 ms (CI 0.500-0.520) in six processes that agree within 4 %."""
    record = make_record(1, "cpu", "inference", 0.509, ci_pct=2.0)
    return dataclasses.replace(record, process_step_times_ms=(0.500, 0.504, 0.508, 0.510, 0.515, 0.520))


BATCH_ONE_OPERATORS = (("aten::mkldnn_convolution", 53.8, 1), ("aten::addmm", 21.1, 2), ("aten::clamp_min", 3.2, 3))


def test_a_traced_step_slower_by_the_profilers_hooks_alone_is_the_timed_step() -> None:
    """The Zen 4 report of 23d0521 flagged 5 of 6 rows: traced steps 1-4 % above the timed interval. Measured beside
    the trace, the process ran at the timed speed and the profiler's hooks made the difference: no flag, the table
    says what the hooks add per operator call and how far that can move a share, and the analysis quotes it."""
    record = _traced_in_process(_batch_one(), 0.507, 0.542, BATCH_ONE_OPERATORS)
    check = record.trace_check
    assert check is not None and check.inside and check.traced_step_ms > record.timing.step_time_ms_ci_high
    (row,) = comparison_rows([record])
    assert row.flags() == "" and measurement_warnings(record) == []
    table = operators_markdown(record)
    assert (
        "The table's pass ran like the timing processes: the 31 steps run untraced around the traced pass took "
        "0.507 ms (median), inside the range one more timing process would run in" in table
    )
    assert "traced, the step took 0.542 ms, +6.9 % (1 pass traced)" in table
    hooks = check.hooks_high_ms
    assert hooks is not None and 0.035 < hooks < 0.045  # the traced set's high end less the untraced set's low end
    # At the same cost per call: each row loses calls x hooks/20 of its self time, the operator time 20 x that.
    per_call, operator_ms = hooks / 20, 0.9 * 0.542
    left = [
        (share / 100 * operator_ms - calls * per_call) / (operator_ms - hooks)
        for _, share, calls in BATCH_ONE_OPERATORS
    ]
    points = max(abs(share - 100 * rest) for (_, share, _), rest in zip(BATCH_ONE_OPERATORS, left, strict=True))
    # Upper bounds, printed rounded up (docs/analysis.md): never below what they bound.
    assert (
        f"The traced steps took at most {math.ceil(hooks * 1000) / 1000:.3f} ms more than the untraced ones around "
        "them (95 % bound from both sets); if the process kept its speed between them, that bounds the profiler's "
        "hooks, over the step's 20 operator calls: at the same cost per call, at most "
        f"{math.ceil(per_call * 10000) / 10:.1f} µs each, which moves no share in this table by more than "
        f"{math.ceil(points * 10) / 10:.1f} points." in table
    )
    assert "**Warning:**" not in table and "cannot rank" not in table
    assert _analysed(record)


def test_a_hooks_bound_past_every_share_says_the_trace_cannot_apportion_the_step() -> None:
    """Traced at 1.5 ms against 0.507 untraced: the hooks' bound moves a share by more than 100 points, which no share
    can move by. The table says the trace cannot apportion the step rather than print that bound."""
    record = _traced_in_process(_batch_one(), 0.507, 1.5, BATCH_ONE_OPERATORS)
    assert record.hooks_share_points is not None and record.hooks_share_points >= 100
    table = operators_markdown(record)
    assert "which could be all of the operator time: this trace cannot apportion the step." in table
    assert "moves no share in this table by more than" not in table


def test_a_tracing_process_at_another_speed_is_flagged_with_its_own_numbers() -> None:
    record = _traced_in_process(_batch_one(), 0.470, 0.538, BATCH_ONE_OPERATORS)
    check = record.trace_check
    assert check is not None and not check.inside and check.expected_low_ms > 0.470
    (row,) = comparison_rows([record])
    assert row.flags() == "table not the timed step"
    (warning,) = measurement_warnings(record)
    assert warning.startswith(
        "the operator table is not the timed step: the 31 steps run untraced around the traced "
        "pass took 0.470 ms (median), "
    )
    assert "% below the range one more timing process would run in" in warning
    assert "this process ran at another speed" in warning and "traces in a new process" in warning
    assert not _analysed(record)
    table = operators_markdown(record)
    assert table.count("0.470 ms") == 1 and "The table's pass" not in table


def test_a_traced_pass_faster_than_the_steps_around_it_bounds_no_hooks() -> None:
    """The traced steps' high end below the untraced ones' low end (the process sped up between them): the hooks
    then have no bound, and no share is said to move by "at most 0.0 points"."""
    record = make_record(16, "cpu", "inference", 4.8, ci_pct=5.0)
    record = dataclasses.replace(record, process_step_times_ms=(4.6, 4.7, 4.8, 4.8, 4.9, 5.0))
    faster = _traced_in_process(record, 5.0, 4.6, BATCH_ONE_OPERATORS)
    check = faster.trace_check
    assert check is not None and check.inside and check.hooks_unbounded and check.hooks_high_ms is None
    table = operators_markdown(faster)
    assert (
        "The profiler's hooks could not be bounded here: the traced steps' median lies below the untraced ones' "
        "around them, and hooks only add time, so the two sets bound nothing of the hooks" in table
    )
    assert "at most 0.000 ms" not in table and "more than 0.0 points" not in table


def test_a_traced_median_below_the_untraced_one_bounds_no_hooks_even_where_the_intervals_overlap() -> None:
    """As an audited batch-16 pass: the traced median (5.80 ms) below the untraced one (5.85 ms), their intervals
    overlapping (each set spread ±1 %). Hooks only add time, so the difference bounds the hooks plus a speed change,
    not the hooks."""
    record = make_record(16, "cpu", "inference", 5.8, ci_pct=5.0)
    record = dataclasses.replace(record, process_step_times_ms=(5.6, 5.7, 5.8, 5.8, 5.9, 6.0))
    slower_around = _traced_in_process(record, 5.85, 5.80, BATCH_ONE_OPERATORS)
    check = slower_around.trace_check
    assert check is not None and check.hooks_unbounded and check.hooks_high_ms is None
    assert "could not be bounded here" in operators_markdown(slower_around)


def test_two_operators_the_hooks_could_reorder_are_not_ranked() -> None:
    """A 7.5 ms training step whose hooks add up to ~0.5 ms over 60 operator calls (~8 µs each): `aten::sqrt_`, 16
    short calls, leads `aten::addmm`, 2 long ones, by less than 14 calls' hooks; with them taken off it could trail."""
    record = make_record(1, "cpu", "train", 7.2, ci_pct=2.0)
    record = dataclasses.replace(record, process_step_times_ms=(7.0, 7.1, 7.2, 7.2, 7.3, 7.4))
    close = _traced_in_process(record, 7.1, 7.6, (("aten::sqrt_", 17.8, 16), ("aten::addmm", 16.0, 2)), 60)
    assert not close.top_operator_ranked
    (row,) = comparison_rows([close])
    # The comparison table's "top operator" cell names both, as the hand-in's caption does.
    assert "| `aten::sqrt_` (17.8 %) or `aten::addmm` (16.0 %), not ranked |" in comparison_markdown([row])
    assert (
        "with it taken off, `aten::addmm` (16.0 %, 2 calls) could lead `aten::sqrt_` (17.8 %, 16), so this trace "
        "cannot rank them." in operators_markdown(close)
    )
    # As many calls each: the hooks take the same off both, and the lead stands.
    same_calls = _traced_in_process(record, 7.1, 7.6, (("aten::sqrt_", 17.8, 16), ("aten::add", 16.0, 16)), 60)
    assert same_calls.top_operator_ranked
    (row,) = comparison_rows([same_calls])
    assert "| `aten::sqrt_` (17.8 %) | 0.0 % |" in comparison_markdown([row])  # the top operator, alone
