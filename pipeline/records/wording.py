"""What a profile stage prints and writes as text: timing summary and warnings, the operator and GPU-kernel
markdown tables and the FLOPs note. Torch-free (it reads a ProfileRecord).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.common.tables import NO_NUMBER
from pipeline.records.profile import DeviceComparisons, PairedComparison, ProfileRecord
from pipeline.records.quantities import MEGABYTE, KernelStats, rounded_up
from pipeline.records.statistics import (
    MIN_ORDER_STATISTIC_PROCESSES,
    PROCESSES_DISAGREE_ADVICE,
    processes_disagree,
    two_speeds,
)


def measurement_warnings(
    record: ProfileRecord, said_for_all: bool = False, disagreement_matters: bool = True
) -> list[str]:
    """What a reader must know before trusting this row, each from the row's own data: a busy machine, timing
    processes that disagree, a traced pass that is not the timed step. `said_for_all`: every row's processes
    disagree, which is said once, so not here; `disagreement_matters`: whether this row's disagreeing processes
    could change a conclusion (`disagreement_said`)."""
    warnings = []
    busy = record.conditions.warning()
    if busy:
        warnings.append(busy)
    medians = record.process_step_times_ms
    if record.timing.noisy and not said_for_all and (disagreement_matters or not _disagree(record)):
        warnings.append(_wide_interval_warning(record))
    groups = two_speeds(medians)
    own = record.timing.own_ci_pct
    # Said only for a split of the combination's own (its spread with the processes' shared speed divided out beyond
    # the target), and where that spread could change a conclusion, as "processes disagree" is. A split the shared
    # speed explains moved the process as a whole: the row's interval holds it, every paired ratio cancels it, and
    # the process-speed sentence says how far apart the processes ran.
    if groups and (own is None or (own > record.settings.ci_target_pct and disagreement_matters)):
        fast, slow = groups
        alone = (
            ""
            if own is None
            else f"with the speed every combination shared in each process divided out, its processes still spread "
            f"±{own:.1f} %: "
        )
        cause = alone + (
            f"with {record.conditions.threads} threads on a small VM a step can jump like this while the machine's "
            "speed does not move (docs/timing.md); `profile.threads: 1`, the default, times steadily"
            if record.combination.kind.on_host and record.conditions.threads > 1
            else "a process settled at another speed in this combination (a process's heap, page placement and "
            "kernels can differ from another's)"
        )
        warnings.append(
            f"two speeds: {len(fast)} timing process(es) at {_span(fast)} ms and {len(slow)} at {_span(slow)} ms, "
            f"{100 * (slow[0] / fast[-1] - 1):.0f} % apart with none between; {cause}"
        )
    check = record.trace_check
    if check is not None and not check.inside:
        cause = (
            "that slower or faster step (the profiler's hooks weigh most on short operators)"
            if check.untraced_step_ms is None
            else f"that process's step; `dvc repro -f profile@{record.combination.device}` traces in a new process"
        )
        warnings.append(
            f"the operator table is not the timed step: {check.placement_sentence()}; its shares describe {cause}"
        )
    return warnings


def disagreement_said(
    records: Sequence[ProfileRecord], comparisons: DeviceComparisons | None
) -> tuple[frozenset[str], bool]:
    """Where "processes disagree" is said, as the report's comparison table says it: the combinations whose
    disagreement could change a conclusion (with the paired comparisons, those in a ratio whose direction is
    undecided; without them, every one), and whether it is said once for all of them because every combination
    raises it (a warning on every row tells nothing)."""
    names = frozenset(record.combination.name for record in records)
    matters = names if comparisons is None else names & comparisons.undecided_names()
    raised = [record for record in records if record.combination.name in matters and _disagree(record)]
    return matters, len(records) > 1 and len(raised) == len(records)


def stage_warnings(records: Sequence[ProfileRecord], comparisons: DeviceComparisons | None = None) -> list[str]:
    """What the profile stage prints, one warning a line: each combination's own, "processes disagree" only where
    it could change a conclusion and said once where every combination raises it, with each one's spread
    (`disagreement_said`)."""
    matters, every = disagreement_said(records, comparisons)
    warnings = [
        f"{record.combination.name}: {warning}"
        for record in records
        for warning in measurement_warnings(
            record, said_for_all=every, disagreement_matters=record.combination.name in matters
        )
    ]
    if every:
        spreads = ", ".join(f"{record.combination.name} ±{record.timing.own_spread_pct:.1f} %" for record in records)
        warnings.insert(
            0,
            f"processes disagree in every combination ({spreads}): beyond the speed all combinations shared in "
            "each timing process, each one's processes still spread wider than the "
            f"±{records[0].settings.ci_target_pct:g} % `profile.ci_target_pct`; {PROCESSES_DISAGREE_ADVICE}",
        )
    return warnings


def _disagree(record: ProfileRecord) -> bool:
    return processes_disagree(record.timing.noisy, len(record.process_step_times_ms))


def _wide_interval_warning(record: ProfileRecord) -> str:
    """Why the row's interval missed the target, from its own processes: they disagree beyond the speed all
    combinations shared in each process, or they are too few for a distribution-free interval (fewer than 6:
    Student's t with few degrees of freedom is wide)."""
    timing, target = record.timing, record.settings.ci_target_pct
    medians = record.process_step_times_ms
    interval = (
        f"the 95 % CI of the median step time reaches ±{timing.step_time_ci_pct:.1f} % from it, wider than the "
        f"±{target:g} % "
    )
    if len(medians) < 2:
        return (
            f"{interval}`profile.ci_target_pct`: its blocks in one process did not pin it down before "
            "`profile.time_budget_s` ran out; raise the budget, or `profile.processes` (a rerun need not respect an "
            "interval from one process)"
        )
    spread_pct = 100.0 * (max(medians) / min(medians) - 1) if min(medians) > 0 else float("inf")
    settled = (
        f"its {len(medians)} timing processes settled at {min(medians):.3f}-{max(medians):.3f} ms "
        f"({spread_pct:.1f} % apart)"
    )
    if len(medians) < MIN_ORDER_STATISTIC_PROCESSES:
        return (
            f"too few processes: {settled}, but from {len(medians)} processes {interval}`profile.ci_target_pct`; "
            f"`profile.processes: {MIN_ORDER_STATISTIC_PROCESSES}` or more gives a distribution-free interval"
        )
    if timing.own_ci_pct is None:
        return f"processes disagree: {settled}, so {interval}`profile.ci_target_pct`; {PROCESSES_DISAGREE_ADVICE}"
    return (
        f"processes disagree: {settled}; with the speed every combination shared in each process divided out, this "
        f"combination's own spread still reaches ±{timing.own_spread_pct:.1f} %, wider than the ±{target:g} % "
        f"`profile.ci_target_pct`; {PROCESSES_DISAGREE_ADVICE}"
    )


def _span(values: Sequence[float]) -> str:
    return f"{values[0]:.3f}" if len(values) == 1 or values[0] == values[-1] else f"{values[0]:.3f}-{values[-1]:.3f}"


def timing_summary(record: ProfileRecord) -> str:
    """One sentence: the estimate, its uncertainty and what it was measured on."""
    timing, conditions = record.timing, record.conditions
    source = (
        f"from the spread between {timing.processes} fresh processes"
        if timing.processes > 1
        else "within one process, which a rerun need not respect"
    )
    return (
        f"Step time {timing.step_time_ms_median:.3f} ms median (IQR {timing.step_time_ms_iqr:.3f} ms; 95 % CI "
        f"{timing.step_time_ms_ci_low:.3f}-{timing.step_time_ms_ci_high:.3f} ms, "
        f"within ±{rounded_up(timing.step_time_ci_pct, 1):.1f} %, "
        f"{source}; {timing.steps_measured} steps in {timing.blocks_measured} blocks); "
        f"{timing.per_sample_ms:.4f} ms per sample; "
        f"{timing.throughput_samples_per_s:.0f} samples/s. Measured with {conditions.threads} "
        f"thread{'s' if conditions.threads != 1 else ''} on "
        f"{conditions.cores} logical CPUs, load average {conditions.load_average_before:.2f} before and "
        f"{conditions.load_average_after:.2f} after, CPU governor {conditions.cpu_governor}."
    )


def trace_sentence(record: ProfileRecord) -> str:
    """What the table's pass was, against the timed step, and how far the profiler's hooks can move its shares ("" where
    the pass is not the timed step: the row's warning says so)."""
    check = record.trace_check
    if check is None:
        return "The traced pass was not checked against the timed step (a record from before that check)."
    if not check.inside:
        return ""
    like = "ran at the timed speed" if check.untraced_step_ms is None else "ran like the timing processes"
    sentence = f"The table's pass {like}: {check.placement_sentence()}."
    if check.hooks_unbounded:
        return (
            f"{sentence} The profiler's hooks could not be bounded here: the traced steps' median lies below the "
            "untraced ones' around them, and hooks only add time, so the two sets bound nothing of the hooks (this "
            "process's speed may have moved between them)."
        )
    points, hooks, per_call = record.hooks_share_points, check.hooks_high_ms, record.hooks_per_call_ms
    if points is None or hooks is None or per_call is None:
        return sentence
    calls, top = record.analysis.anatomy.operator_calls_per_step, record.top_operators
    sentence += (
        f" The traced steps took at most {rounded_up(hooks, 3):.3f} ms more than the untraced ones around them (95 % "
        "bound from both sets); if the process kept its speed between them, that bounds the profiler's hooks, over "
        f"the step's {calls:.0f} operator calls: at the same cost per call, at most "
        f"{rounded_up(1000 * per_call, 1):.1f} µs each, "
    )
    if math.isinf(points) or points >= 100:  # a bound past every share says nothing of any of them
        return sentence + "which could be all of the operator time: this trace cannot apportion the step."
    sentence += f"which moves no share in this table by more than {rounded_up(points, 1):.1f} points"
    if not record.top_operator_ranked:
        sentence += (
            f"; with it taken off, `{top[1].operator}` ({top[1].share_pct:.1f} %, {top[1].calls_per_step:.0f} calls) "
            f"could lead `{top[0].operator}` ({top[0].share_pct:.1f} %, {top[0].calls_per_step:.0f}), so this trace "
            "cannot rank them"
        )
    return sentence + "."


def comparisons_markdown(comparisons: DeviceComparisons) -> str:
    """profiles/<device>/comparisons.md: every paired ratio with its interval and what each process saw."""
    lines = [
        f"### Paired comparisons: {comparisons.device}",
        "",
        f"Each ratio was measured paired: all combinations timed interleaved, round by round in random order, in the "
        f"same {comparisons.processes} fresh processes; each process's ratio is the median over its rounds, the "
        "ratio is the median over processes and its 95 % CI their spread. Per sample: the larger batch's time per "
        "sample over the smaller's (below 1: the larger batch is cheaper per sample). Per step: a training step "
        "over an inference step at the same batch size.",
        "",
        *ratio_table(comparisons.comparisons),
        "",
        process_speed_sentence(comparisons),
        *parts_lines(comparisons.parts),
    ]
    return "\n".join(lines) + "\n"


def parts_lines(parts: Sequence[PairedComparison]) -> list[str]:
    """The training step's parts (DeviceComparisons.parts), timed untraced: their table and what leaving the update out
    saves of each training step; nothing where none were timed."""
    if not parts:
        return []
    shares = [
        f"batch {c.numerator.split('-', 1)[0]} {100 * (1 - 1 / c.value):.1f} % "
        f"({100 * (1 - 1 / c.low):.1f}-{100 * (1 - 1 / c.high):.1f} %)"
        for c in parts
        if c.numerator.endswith("-train")
    ]
    return [
        "",
        "#### The training step's parts, timed without a profiler",
        "",
        "At each batch size profiled in both modes, the training step without the optimizer's update (the train-mode "
        "forward, the loss, backward and clearing the gradients: `gradients`) was timed in the same rounds of the "
        "same processes. Training over it is the update's factor; it over inference is the step without the update "
        "against the inference step.",
        "",
        *ratio_table(parts),
        "",
        "What leaving the update out saves of a training step (1 - 1 / its factor; 95 % CI from the factor's): "
        f"{'; '.join(shares)}.",
    ]


def ratio_numbers(comparison: PairedComparison) -> tuple[str, str, str]:
    """A ratio's value and 95 % CI bounds, printed alike with at least three decimals and at least three significant
    digits of the smallest: 0.0172 (0.0170-0.0174) stays apart where three decimals would print 0.017 three times."""
    numbers = (comparison.value, comparison.low, comparison.high)
    smallest = min((abs(number) for number in numbers if number), default=1.0)
    decimals = max(3, 2 - math.floor(math.log10(smallest)))
    value, low, high = (f"{number:.{decimals}f}" for number in numbers)
    return value, low, high


def ratio_table(comparisons: Sequence[PairedComparison]) -> list[str]:
    """The markdown lines of a table of paired ratios: value, 95 % CI, its half-width and what the processes saw."""
    lines = [
        "| ratio | per | value | 95 % CI | wider side, ± % | the processes |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for c in comparisons:
        value, low, high = ratio_numbers(c)
        lines.append(
            f"| {c.numerator} / {c.denominator} | {c.per} | {value} | {low}-{high} | "
            f"±{rounded_up(c.half_width_pct, 1):.1f} | {every_process_words(c)} |"
        )
    return lines


def process_speed_sentence(comparisons: DeviceComparisons) -> str:
    """How far the machine's speed moved between this run's timing processes: said once, for the device."""
    speeds = comparisons.process_speeds
    if len(speeds) < 2:
        return "One timing process: how far the machine's speed moves between processes was not measured."
    return (
        f"Between its {len(speeds)} timing processes the {comparisons.device} ran up to "
        f"{rounded_up(comparisons.speed_spread_pct, 1):.1f} % apart in the speed its combinations shared (each "
        "process's shared time factor, the median over combinations of its step time over that combination's median "
        f"across the processes, above 1 slower: {', '.join(f'{speed:.3f}' for speed in speeds)}): each row's interval "
        "holds that, the paired ratios cancel it; what a combination moved on its own is in its own spread."
    )


def every_process_words(comparison: PairedComparison) -> str:
    values = comparison.process_values
    if values and all(value > 1 for value in values):
        return f"above 1 in all {len(values)} processes"
    if values and all(value < 1 for value in values):
        return f"below 1 in all {len(values)} processes"
    return f"{sum(value > 1 for value in values)} of {len(values)} processes above 1"


def operators_markdown(record: ProfileRecord, said_for_all: bool = False, disagreement_matters: bool = True) -> str:
    """top_operators.md: the timing summary, the row's warnings (`measurement_warnings`), the operator table (no GPU
    column where no GPU was traced, NO_NUMBER where there is no number) and what its MFLOPs column holds."""
    combination, rows = record.combination, record.top_operators
    on_gpu = not combination.kind.on_host
    ranked_by = combination.kind.time_ranked_by
    gpu_header = ("self GPU ms | ", "---: | ") if on_gpu else ("", "")
    allocated = any(row.allocated_mb is not None for row in rows)  # records before format 7 have no such column
    memory_header = (" allocated MB |", " ---: |") if allocated else ("", "")
    lines = [
        f"### Top {len(rows)} operators: batch {combination.batch_size}, {combination.device}, {combination.mode}",
        "",
        f"{timing_summary(record)} ATen operators ranked by {ranked_by}; times are per traced step, and the share "
        "is of the traced step's operator time.",
        "",
        *((sentence, "") if (sentence := trace_sentence(record)) else ()),
        *(f"**Warning:** {warning}.\n" for warning in measurement_warnings(record, said_for_all, disagreement_matters)),
        f"| # | operator | calls | self CPU ms | total CPU ms | {gpu_header[0]}share % | MFLOPs |{memory_header[0]}",
        f"| ---: | --- | ---: | ---: | ---: | {gpu_header[1]}---: | ---: |{memory_header[1]}",
    ]
    graph = record.graph_metrics()
    if graph:
        lines[3:3] = [
            "",
            f"The same step replayed from a CUDA graph: {graph['graph_step_time_ms_median']:.3f} ms median. "
            f"Host overhead (eager - graph medians): {graph['host_overhead_ms']:.3f} ms, "
            f"{graph['host_overhead_pct']:.0f} % of the eager step: launching kernels one by one from Python, "
            "which a replay leaves out.",
        ]
    whatif, slowdown = record.allocator_whatif, record.allocator_slowdown
    if whatif and slowdown:
        paired = " (paired)" if whatif.paired else ""
        lines[3:3] = [
            "",
            f"Allocator what-if: with glibc malloc's defaults the same step took "
            f"{whatif.step_time_ms_median:.3f} ms median, defaults ÷ tuned{paired} "
            f"{slowdown.with_interval()}; "
            f"{page_faults_text(whatif.page_faults_per_step)} page faults per step (median of the processes) against "
            f"{page_faults_text(whatif.tuned_page_faults_per_step)} tuned (one count, in the profile stage's own "
            f"process; {record.settings.allocator}).",
        ]
    for rank, row in enumerate(rows, start=1):
        gpu = f"{_cell(row.self_device_ms, '.3f')} | " if on_gpu else ""
        lines.append(
            f"| {rank} | `{row.operator}` | {row.calls_per_step:g} | {row.self_cpu_ms:.3f} | {row.total_cpu_ms:.3f} | "
            f"{gpu}{row.share_pct:.1f} | {_mflops(row.mflops)} |"
            + (f" {_cell(row.allocated_mb, '.3f')} |" if allocated else "")
        )
    lines += ["", flops_note(record)]
    if record.memory is not None:
        lines += [
            "",
            f"Allocated MB per step: what the allocator handed out on the {combination.device} while the operator was "
            "the innermost one running; what the step holds at its peak is in `memory.md` beside this table (in the "
            "report, its section on memory and energy).",
        ]
    if record.analysis.ranges:  # record_function ranges: their time is their operators' time, so never ranked
        ranges = "; ".join(
            f"`{r.name}` {r.cpu_ms:.3f} ms CPU" + (f", {r.device_ms:.3f} ms {combination.kind.label}" if on_gpu else "")
            for r in record.analysis.ranges
        )
        lines += [
            "",
            f"Profiler ranges, not ranked (each range's time holds the operators inside it and whatever else ran "
            f"inside it): {ranges}.",
        ]
    return "\n".join(lines) + "\n"


def flops_note(record: ProfileRecord) -> str:
    """What the MFLOPs column holds, and how much of the step's counted work the rows shown carry."""
    if record.format < 3:
        return (
            f"MFLOPs per step as torch.profiler counted them (a format-{record.format} record: a convolution's "
            f"forward FLOPs on `aten::conv2d`, none for its backward); {NO_NUMBER} where it counted none. "
            "Rerun the profile stage for FLOPs credited to the operators that run them."
        )
    shown = sum(row.mflops for row in record.top_operators if row.mflops is not None)
    model = record.analysis.flop_rate.flops_per_step / 1e6
    kind = "forward" if record.combination.mode == "inference" else "training (forward + backward)"
    return (
        "MFLOPs per step: convolutions and matrix products, forward and backward, counted by "
        "torch.utils.flop_counter and credited once, to the operator that runs them (such as "
        f"`aten::mkldnn_convolution`, `aten::cudnn_convolution`, `aten::convolution_backward`, `aten::addmm`, "
        f"`aten::mm`); {NO_NUMBER} where an operator runs none itself: no FLOP formula (element-wise ops count "
        "none, as in the model summary), or a wrapper such as `aten::conv2d` or `aten::linear`, whose work is "
        f"on the operator it calls. The rows shown carry {shown:.1f} of the {model:.1f} MFLOPs per step of the "
        f"model summary ({kind} FLOPs per sample x batch {record.combination.batch_size})."
    )


def _cell(value: float | None, spec: str) -> str:
    return NO_NUMBER if value is None else format(value, spec)


def _mflops(value: float | None) -> str:
    """One decimal, but never a non-zero count that reads as 0.0 (batch 1's last layer does 0.0026 MFLOPs)."""
    if value is None:
        return NO_NUMBER
    return f"{value:.1f}" if value >= 0.1 or value == 0 else f"{value:.2g}"


def kernels_markdown(record: ProfileRecord) -> str:
    """The record's kernel table (top_kernels.md); on the CPU, a line saying there is none."""
    combination, kernels = record.combination, record.analysis.top_kernels
    where = f"batch {combination.batch_size}, {combination.device}, {combination.mode}"
    if not kernels:
        return f"### GPU kernels: {where}\n\n_None: this combination ran on the {combination.device}._\n"
    return kernel_table_markdown(kernels, f"### Top {len(kernels)} GPU kernels: {where}")


def kernel_table_markdown(kernels: Sequence[KernelStats], heading: str) -> str:
    """Top kernels of one combination: readable name, the operator that launched it, time per step."""
    lines = [
        heading,
        "",
        "Share of the GPU's busy time; full kernel names are in the CSV.",
        "",
        "| # | kernel | launched by | launches | GPU ms | mean µs | share % |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for rank, row in enumerate(kernels, start=1):
        lines.append(
            f"| {rank} | {row.kernel} | `{row.launched_by}` | {row.launches_per_step:g} | {row.device_ms:.4f} | "
            f"{row.mean_us:.1f} | {row.share_pct:.1f} |"
        )
    return "\n".join(lines) + "\n"


def memory_markdown(record: ProfileRecord) -> str:
    """memory.md: what the step holds at its peak, by part, and what it draws in energy (or why that is unknown)."""
    combination, memory = record.combination, record.memory
    where = f"batch {combination.batch_size}, {combination.device}, {combination.mode}"
    lines = [f"### Memory at the step's peak: {where}", ""]
    if memory is None:
        lines.append(f"_Not measured: a format-{record.format} record; rerun `dvc repro -f {combination.stage_name}`._")
        return "\n".join(lines) + "\n"
    spread = (
        f"{memory.processes} timing processes measured {memory.peak_low_bytes / MEGABYTE:.3f}-"
        f"{memory.peak_high_bytes / MEGABYTE:.3f} MB"
        if memory.processes > 1
        else "one process measured it"
    )
    lines += [
        f"The step holds {memory.peak_mb:.3f} MB at its peak ({spread}): the {memory.start_bytes / MEGABYTE:.3f} MB "
        f"it starts from ({_start_parts(combination.mode)}) and "
        f"{memory.peak_above_start_bytes / MEGABYTE:.3f} MB more. Measured from the allocator's record of every "
        "allocation and free during one step, after the timing; each tensor alive at the peak is counted under "
        "what it is. MB are 10^6 bytes.",
        "",
        "| part | MB | % of peak |",
        "| --- | ---: | ---: |",
        *(
            f"| {part.name} | {part.bytes / MEGABYTE:.3f} | {100 * part.bytes / memory.peak_bytes:.1f} |"
            for part in memory.parts
            if memory.peak_bytes
        ),
        f"| **peak** | **{memory.peak_mb:.3f}** | 100 |",
        "",
        f"Resident: {memory.resident_bytes / MEGABYTE:,.0f} MB, {memory.resident_of}."
        + (
            f" The CUDA allocator's own statistics (max_memory_allocated less memory_allocated at the start) put the "
            f"peak {memory.allocator_peak_above_start_bytes / MEGABYTE:.3f} MB above the start."
            if memory.allocator_peak_above_start_bytes is not None
            else ""
        ),
        "",
        energy_sentence(record),
    ]
    return "\n".join(lines) + "\n"


def _start_parts(mode: str) -> str:
    """What a step of `mode` holds when it starts."""
    return "the weights and the batch" if mode == "inference" else "weights, optimizer state, batch, last gradients"


def energy_sentence(record: ProfileRecord) -> str:
    """The step's energy with its interval, or why there is none; never a zero."""
    energy, batch = record.energy, record.combination.batch_size
    if energy is None:
        why = record.energy_unavailable or "not measured (a record from before energy was measured)"
        return f"Energy: {why}."
    sample = energy.per_sample(batch)
    limits = (
        f"; power limit {energy.power_limit_w:.0f} W, SM clock {energy.sm_clock_mhz:.0f} MHz, memory clock "
        f"{energy.memory_clock_mhz:.0f} MHz"
        if energy.power_limit_w is not None and energy.sm_clock_mhz is not None and energy.memory_clock_mhz is not None
        else ""
    )
    return (
        f"Energy: {energy.joules_per_step * 1000:.3f} mJ per step (95 % CI {energy.joules_per_step_low * 1000:.3f}-"
        f"{energy.joules_per_step_high * 1000:.3f}, from {energy.processes} processes), {sample.value * 1000:.4f} mJ "
        f"per sample, at {energy.mean_power_w:.0f} W while it ran; {energy.counter}, which moved every "
        f"{energy.update_period_ms:.0f} ms, polled during the timing: the power fitted over {energy.windows} of its "
        f"updates, times the step's time{limits}."
    )


def page_faults_text(per_step: float) -> str:
    """Page faults per step (a median over processes, so a fraction): whole numbers from 10 on, two decimals below
    (0.03 is not 0)."""
    return f"{per_step:,.0f}" if per_step >= 10 else f"{per_step:.2f}"
