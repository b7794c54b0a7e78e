"""The allocator what-if as report text: the same step with glibc malloc's defaults and tuned, per CPU combination.

Each CPU profile stage times its combinations in fresh processes with the tuned allocator and, paired with each,
in as many that keep glibc's defaults (pipeline.profiling.run, pipeline.common.allocator); the record keeps both and
their ratio pair by pair. The lesson: the same model and the same operators, one allocator setting apart, and the
operator table charges the page faults to whichever operator allocates. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.records.profile import AllocatorWhatIf, ProfileRecord
from pipeline.records.quantities import Ratio
from pipeline.records.wording import page_faults_text
from pipeline.report.tables import markdown_table

SHIFTED_OPERATORS = 2  # operators named per combination: those whose share moves the most


def whatif_records(records: Sequence[ProfileRecord]) -> list[tuple[ProfileRecord, AllocatorWhatIf, Ratio]]:
    """Each record the what-if ran for, with the what-if and its defaults ÷ tuned ratio."""
    return [
        (record, record.allocator_whatif, record.allocator_slowdown)
        for record in records
        if record.allocator_whatif is not None and record.allocator_slowdown is not None
    ]


def allocator_markdown(records: Sequence[ProfileRecord]) -> str:
    """The what-if table, or a line saying why there is none."""
    measured = whatif_records(records)
    if not measured:
        return (
            "No allocator what-if in these profiles: it runs on CPU combinations when `profile.allocator_whatif_s` "
            "is above 0 and the stage tunes glibc's allocator itself (not with `LAB_ALLOCATOR=default`, glibc's "
            "`MALLOC_*` variables or an allocator in `LD_PRELOAD`).\n"
        )
    rows = []
    for record, whatif, slowdown in measured:
        tuned = record.timing.step_interval
        default = whatif.step_interval
        rows.append(
            (
                f"{record.combination.batch_size} {record.combination.mode}",
                f"{default.value:.3f} ({default.low:.3f}-{default.high:.3f})",
                f"{tuned.value:.3f} ({tuned.low:.3f}-{tuned.high:.3f})",
                slowdown.with_interval(),
                _faults(whatif),
                page_faults_text(whatif.tuned_page_faults_per_step),
                shifted_operators(record, whatif),
            )
        )
    columns = (
        "batch, mode",
        ">step ms, glibc defaults (95 % CI)",
        ">step ms, tuned (95 % CI)",
        ">defaults ÷ tuned",
        ">page faults per step, defaults: median (processes' range)",
        ">tuned: one count, in the profile stage's own process",
        "operators whose share moves most, among those in both tables (defaults → tuned)",
    )
    allocators = sorted({whatif.default_allocator for _, whatif, _ in measured})
    tuned_allocators = sorted({record.settings.allocator for record, _, _ in measured})
    how = (
        "in fresh processes, each started next to a tuned timing process (just before or after it, in turn) and "
        "timing the same combinations interleaved, so the ratio is taken pair by pair (95 % CI from the pairs' spread)"
        if all(whatif.paired for _, whatif, _ in measured)
        else "in the stage's own process, not paired with the tuned timing (the ratio's interval is built from both "
        "intervals)"
    )
    return "\n".join(
        [
            f"Every CPU profile stage also times its steps with glibc malloc's defaults ({'; '.join(allocators)}), "
            f"{how}; everything else, the tables included, runs with the tuned allocator "
            f"({'; '.join(tuned_allocators)}). With the defaults, glibc's manual says, buffers above the mmap "
            "threshold are mapped and unmapped every time, so each step can fault its memory in again page by page, "
            "in the time of whichever operator touches it first. How often that happens depends on what the process "
            "freed before (glibc's manual: it raises its threshold to the largest mapped block freed so far), so the "
            "page faults differ between processes. These runs count the faults beside the slowdown; they do not test "
            "whether the faults cause it (process by process the two need not move together). The "
            "table gives their median (of an even number of processes, the mean of the middle two) and their range.\n",
            *markdown_table(columns, rows),
            "",
        ]
    )


def shifted_operators(record: ProfileRecord, whatif: AllocatorWhatIf) -> str:
    """The operators whose share of the step moves most between the defaults and the tuned allocator."""
    tuned = {row.operator: row.share_pct for row in record.top_operators}
    default = {row.operator: row.share_pct for row in whatif.operators}
    # Only operators both tables rank: a share missing from a top-k list is unknown, not 0.
    both = [name for name in default if name in tuned]
    moved = sorted(both, key=lambda name: abs(default[name] - tuned[name]), reverse=True)[:SHIFTED_OPERATORS]
    return ", ".join(f"`{name}` {default[name]:.1f} → {tuned[name]:.1f} %" for name in moved) or "–"


def allocator_sentences(records: Sequence[ProfileRecord]) -> list[str]:
    """One analysis sentence: the CPU combinations the defaults measurably slowed, with their ratios, and those
    whose interval cannot tell."""
    measured = whatif_records(records)
    if not measured:
        return []
    ratios = [(record, slowdown) for record, _, slowdown in measured]
    paired = all(whatif.paired for _, whatif, _ in measured)
    slower = sorted(
        ((record, value) for record, value in ratios if value.measurable and value.low > 1),
        key=lambda pair: -pair[1].value,
    )
    unmeasurable = [f"{record.combination.name} ({value.bounds()})" for record, value in ratios if not value.measurable]
    faster = [f"{record.combination.name} ({value.with_interval()})" for record, value in ratios if value.high < 1]
    undecided = (
        f" For {', '.join(unmeasurable)} the interval includes 1: the data cannot tell whether the defaults cost "
        "them time."
        if unmeasurable
        else ""
    )
    if not slower:
        sentence = (
            "Memory allocation: slower with glibc malloc's defaults than with the tuned allocator at no CPU step that "
            "the data decide" + (f"; faster with the defaults: {', '.join(faster)}" if faster else "") + "." + undecided
        )
        return [sentence]
    listed = ", ".join(
        f"batch {record.combination.batch_size} {record.combination.mode} {value.with_interval()}"
        for record, value in slower
    )
    sentence = (
        "Memory allocation: measurably slower with glibc malloc's defaults than with the tuned allocator, with the "
        f"same operators on the same values: {listed}."
    )
    sentence += (
        " Paired: each defaults process ran next to a tuned one, so drift that both processes of a pair shared "
        "cancels in these ratios (what each process did on its own stays in their spread)."
        if paired
        else " Not paired: the defaults were timed in the stage's own process and the tuned step in the timing "
        "processes, minutes apart at most."
    )
    sentence += undecided
    if faster:
        sentence += f" Faster with the defaults: {', '.join(faster)}."
    # Where neither set-up page-faulted, a measurable difference cannot be the faults; the data hold no other cause.
    drift = [
        f"{record.combination.name} ({value.with_interval()})"
        for record, value in ratios
        if value.measurable
        and record.allocator_whatif is not None
        and not any(record.allocator_whatif.process_page_faults)
        and record.allocator_whatif.page_faults_per_step == 0
        and record.allocator_whatif.tuned_page_faults_per_step == 0
    ]
    if drift:
        sentence += (
            f" Neither set-up page-faulted in {', '.join(drift)}: that difference is not page faults, and these "
            "measurements do not say what it is."
        )
    return [sentence]


def _faults(whatif: AllocatorWhatIf) -> str:
    """The defaults' page faults per step: the median over the processes, with their range where they were recorded."""
    counts = whatif.process_page_faults
    median = page_faults_text(whatif.page_faults_per_step)
    return f"{median} ({page_faults_text(min(counts))}-{page_faults_text(max(counts))})" if counts else median
