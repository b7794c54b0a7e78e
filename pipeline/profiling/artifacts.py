"""What the profile stage writes (tables, records, comparisons, metrics for DVC) and logs (MLflow, TensorBoard)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.numbers import significant
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import DeviceProfileOutputs, ProfileOutputs
from pipeline.common.tables import records_csv
from pipeline.params.schema import TrackingConfig
from pipeline.records.profile import (
    METRIC_PREFIX,
    DeviceComparisons,
    OperatorRow,
    ProfileRecord,
    StepAnalysis,
    write_comparisons,
    write_record,
)
from pipeline.records.quantities import KernelStats
from pipeline.records.wording import (
    comparisons_markdown,
    kernels_markdown,
    memory_markdown,
    operators_markdown,
    timing_summary,
)
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.tracker import Tracker


@dataclass(frozen=True)
class ProfileTexts:
    operators: str  # markdown table of the top operators, with the timing summary
    kernels: str  # markdown table of the top kernels (a note on the CPU)
    memory: str  # what the step holds at its peak, by part, and its energy

    def console(self, record: ProfileRecord, paths: ProfileOutputs) -> str:
        """What the stage prints: the estimate, the top operator (and kernel), the verdict and where the tables are.
        The tables themselves go to the files, the MLflow run and TensorBoard's Text tab, not the console, where
        tens of lines each would bury the one line a reader needs. Warnings are printed apart, once."""
        lines = [timing_summary(record)]
        if record.top_operators:
            top = record.top_operators[0]
            lines.append(f"Top operator: {top.operator}, {top.share_pct:.1f} % of the step's operator time.")
        if record.analysis.top_kernels:
            kernel = record.analysis.top_kernels[0]
            lines.append(f"Top GPU kernel: {kernel.kernel}, {kernel.share_pct:.1f} % of the GPU's busy time.")
        anatomy = record.analysis.anatomy
        lines.append(f"{anatomy.words}: {anatomy.reason}.")
        files = [paths.table_markdown] + ([paths.kernel_table_markdown] if record.analysis.top_kernels else [])
        lines.append(f"Tables: {', '.join(str(path) for path in files)}; trace: {paths.trace} (Perfetto).")
        return "\n".join(lines)


def profile_metrics(record: ProfileRecord) -> dict[str, float]:
    """timing.json + step_analysis.json together: the MLflow/TensorBoard metrics of every combination."""
    return {**record.as_metrics(), **step_metrics(record.analysis)}


def write_profile_outputs(
    outputs: AtomicOutputs,
    paths: ProfileOutputs,
    record: ProfileRecord,
    said_for_all: bool = False,
    disagreement_matters: bool = True,
) -> ProfileTexts:
    """The combination's files; its operator table warns of disagreeing processes as `disagreement_said` decides."""
    operators = operators_markdown(record, said_for_all, disagreement_matters)
    texts = ProfileTexts(operators, kernels_markdown(record), memory_markdown(record))
    outputs.write_text(paths.table_markdown, texts.operators)
    outputs.write_text(paths.memory_markdown, texts.memory)
    outputs.write_text(paths.table_csv, records_csv(OperatorRow, record.top_operators))
    outputs.write_text(paths.kernel_table_markdown, texts.kernels)
    outputs.write_text(paths.kernel_table_csv, records_csv(KernelStats, record.analysis.top_kernels))
    outputs.write_text(paths.record, write_record(record))
    outputs.write_json(paths.timing, record.as_metrics())
    outputs.write_json(paths.step_analysis, step_metrics(record.analysis))
    outputs.write_json(paths.metrics_file, headline_metrics(record))
    return texts


HEADLINE_DIGITS = 3  # significant digits: the CI is rarely tighter than ±1 %, so a 4th digit is noise


def headline_metrics(record: ProfileRecord) -> dict[str, float | bool]:
    """profiles/<combination>/metrics.json, DVC's metrics: the lab's result for one combination, rounded.

    The same seven keys in every combination, so `dvc metrics show profiles` is one dense table (a row per
    combination) and `dvc metrics diff` a few rows each, not the 32 numbers per combination of timing.json and
    step_analysis.json (which MLflow and the report keep). Rounded to what the interval supports, so a rerun
    does not list a change in the 6th digit.
    """
    timing = record.timing
    return {
        "per_sample_ms": significant(timing.per_sample_ms, HEADLINE_DIGITS),
        "step_time_ms_median": significant(timing.step_time_ms_median, HEADLINE_DIGITS),
        "step_time_ci_pct": significant(timing.step_time_ci_pct, 2),
        "throughput_samples_per_s": significant(timing.throughput_samples_per_s, HEADLINE_DIGITS),
        "peak_pct": significant(record.analysis.flop_rate.peak_pct, 2),
        "memory_mb": significant(timing.peak_memory_mb, HEADLINE_DIGITS),  # what the step holds at its peak
        "noisy": timing.noisy,
    }


def write_comparison_outputs(
    outputs: AtomicOutputs, paths: DeviceProfileOutputs, comparisons: DeviceComparisons
) -> str:
    """profiles/<device>/comparisons.json and .md, and DVC's metrics of the device (the ratios and the training step's
    parts, rounded)."""
    text = comparisons_markdown(comparisons)
    outputs.write_text(paths.comparisons, write_comparisons(comparisons))
    outputs.write_text(paths.comparisons_markdown, text)
    outputs.write_json(
        paths.metrics_file,
        {
            f"{c.numerator} / {c.denominator}": {
                "ratio": significant(c.value, HEADLINE_DIGITS),
                "ci_pct": significant(c.half_width_pct, 2),
            }
            for c in (*comparisons.comparisons, *comparisons.parts)
        },
    )
    return text


def log_profile(
    tracking: TrackingConfig,
    run: RunDescription,
    outputs: AtomicOutputs,
    paths: ProfileOutputs,
    record: ProfileRecord,
    texts: ProfileTexts,
    comparisons: str,
    run_id: str | None = None,
) -> tuple[Tracker, str]:
    """One MLflow run (and TensorBoard folder) per combination, `profile@<batch>-<device>-<mode>`, ended before the
    device's outputs are committed: returned with its name (tracking.lifecycle.settled_after_commit). `run_id`: the
    run the stage created for it before measuring (tracking.lifecycle.runs_started_early)."""
    combination, timing = record.combination, record.timing
    with open_tracker("profile", tracking, variant=combination.name, current=False, run_id=run_id) as tracker:
        tracker.log_params(run.params)
        tracker.set_tags(run.tags)
        tracker.link_training(run.model_digest)
        tracker.log_summary(profile_metrics(record), prefix=METRIC_PREFIX)
        tracker.log_curve(f"{METRIC_PREFIX}block_step_time_ms", record.block_times_ms)
        # TensorBoard's HParams view: the combinations as a table (batch size x device x mode) beside their times.
        tracker.log_hparams(
            {
                "profile.batch_size": combination.batch_size,
                "profile.device": combination.device,
                "profile.mode": combination.mode,
            },
            {
                "hparam/step_time_ms_median": timing.step_time_ms_median,
                "hparam/per_sample_ms": timing.per_sample_ms,
                "hparam/throughput_samples_per_s": timing.throughput_samples_per_s,
            },
        )
        tracker.log_text("profile/top_operators", texts.operators, "top_operators.md")
        tracker.log_text("profile/top_kernels", texts.kernels, "top_kernels.md")
        tracker.log_text("profile/memory", texts.memory, "memory.md")
        tracker.log_text("profile/comparisons", comparisons, "comparisons.md")
        for path in (paths.table_csv, paths.kernel_table_csv, paths.record, paths.trace):
            tracker.log_artifact(outputs.staged(path))
        # The device's outputs move into place once every combination is logged, after this run has ended: it
        # records now the md5 of the files it wrote, by which a later stage finds it (lineage.producer_run).
        tracker.before_commit({path: outputs.staged(path) for path in paths.files()})
    return tracker, f"profile@{combination.name}"


@dataclass(frozen=True)
class RunDescription:
    """What a combination's MLflow run records besides its results: params, tags, the checkpoint it profiled."""

    params: dict[str, object]
    tags: dict[str, str]
    model_digest: str


def step_metrics(analysis: StepAnalysis) -> dict[str, float]:
    """The step analysis as metrics, under the same names for every device and mode (MLflow's Compare
    lines them up): `busy_pct` is GPU busy time on a GPU and time inside ATen operators on the CPU."""
    anatomy, rate = analysis.anatomy, analysis.flop_rate
    return {
        "traced_step_ms": anatomy.step_ms,
        "busy_pct": anatomy.busy_pct,
        "idle_pct": anatomy.idle_pct,
        "host_bound": 1.0 if anatomy.host_bound else 0.0,
        "device_activities_per_step": anatomy.launches_per_step,
        "launch_call_ms": anatomy.launch_call_ms,
        "achieved_gflops_per_s": rate.achieved_gflops_per_s,
        "peak_gflops_per_s": rate.peak_gflops_per_s,
        "peak_pct": rate.peak_pct,
    }
