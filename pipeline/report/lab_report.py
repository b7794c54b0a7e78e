"""The lab report, generated from the stage outputs: environment, graph, training, profiles, analysis.

Every number in it is read from a stage output (nothing is re-measured), and every input that is
missing is named in the report with the command that produces it, never silently dropped.
Torch-free: profiles are read through `pipeline.records.profile`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import re
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.common.errors import PipelineError
from pipeline.common.input_files import read_json_object, read_number_csv, read_text, rerun
from pipeline.common.machine import CPU_MODEL
from pipeline.common.paths import (
    GRAPH_METRICS,
    GRAPH_SVG,
    HARDWARE_FINGERPRINT,
    HARDWARE_ROOFS,
    SUMMARY_JSON,
    SUMMARY_MARKDOWN,
    TRAIN_EPOCHS_PLOT,
    TRAIN_METRICS,
    TRAIN_SPEED,
    TRAIN_STEPS_PLOT,
)
from pipeline.params.schema import Params, ProfileConfig
from pipeline.records.profile import DeviceComparisons, ProfileRecord, read_profiles
from pipeline.records.quantities import rounded_up
from pipeline.records.roofs import SpeedDrift, read_roofs
from pipeline.records.statistics import GRADIENTS
from pipeline.records.wording import process_speed_sentence
from pipeline.report.allocator_whatif import allocator_markdown, allocator_sentences
from pipeline.report.catalogue import Catalogue, load_catalogue
from pipeline.report.comparison import (
    ComparisonRow,
    comparison_markdown,
    comparison_rows,
    comparisons_table,
)
from pipeline.report.conclusion import conclusion
from pipeline.report.figures import batch_size_plot, cpu_vs_gpu_figure, read_csv, roofline_figure, training_curves
from pipeline.report.findings import AnalysisData, Finding, findings
from pipeline.report.memory import memory_section
from pipeline.report.rendering import GRAPH_FIGURE
from pipeline.report.roofline import roofline_chart, roofline_markdown, roofline_points
from pipeline.report.step_analysis import (
    StepFacts,
    anatomy_markdown,
    cpu_vs_gpu_markdown,
    flop_rate_markdown,
    has_gpu_pairs,
    step_facts,
    step_sentences,
)

TITLE = "AI-System Lab 1: MNIST CNN — training, dataflow graph and operator profile"


@dataclass
class ReportInputs:
    hardware: dict[str, str] | None
    train_metrics: dict[str, float] | None
    train_speed: dict[str, Any] | None  # images_per_second, train_seconds, runtime (what ran)
    graph_metrics: dict[str, float] | None
    model_summary: str | None
    profiles: list[ProfileRecord]  # in params order
    comparisons: list[DeviceComparisons] = field(default_factory=list)  # one per profiled device
    drift: dict[str, SpeedDrift] = field(default_factory=dict)  # per device: the roofs stage's measured drift probe
    missing: list[str] = field(default_factory=list)  # one sentence per absent input
    model_layers: list[dict[str, Any]] | None = None  # graph/summary.json's layers: parameters, FLOPs per sample
    # The installed TensorBoard's version (the one `tensorboard --logdir runs` and `make handin-views` use), read by
    # the report stage: the fingerprint does not hold it, and adding it there would re-measure every machine's roofs.
    tensorboard: str | None = None


def read_json(
    path: Path, producer: str, missing: list[str], numbers: tuple[str, ...] = (), texts: tuple[str, ...] = ()
) -> Any:
    """`path`'s object, checked (pipeline.common.input_files); None, named in `missing`, where it does not exist."""
    if not path.exists():
        missing.append(f"`{path}` is missing: run `dvc repro {producer}`.")
        return None
    return read_json_object(path, producer, numbers, texts)


HARDWARE_TEXTS = (CPU_MODEL, "cpu_count", "os", "machine", "python", "torch", "torchvision", "torch_cuda_build")
TRAIN_METRIC_NUMBERS = ("test_accuracy", "test_loss", "train_accuracy", "train_loss")
EPOCH_COLUMNS = ("epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy")
STEP_COLUMNS = ("step", "epoch", "train_loss", "train_accuracy")


def read_inputs(config: ProfileConfig) -> ReportInputs:
    """Every stage output the report reads, each checked here, before anything is drawn or written: a damaged one
    stops the stage with the file and the stage that rewrites it; a missing one is named in the report."""
    profiles = read_profiles(config)
    for record in profiles.records:
        read_text(record.combination.outputs.table_markdown, record.combination.stage_name)
        if record.analysis.top_kernels:
            read_text(record.combination.outputs.kernel_table_markdown, record.combination.stage_name)
    for plot, columns in ((TRAIN_EPOCHS_PLOT, EPOCH_COLUMNS), (TRAIN_STEPS_PLOT, STEP_COLUMNS)):
        if plot.exists():
            read_number_csv(plot, "train", columns)
    missing = list(profiles.missing)
    drift = {}
    if HARDWARE_ROOFS.exists():
        drift = {
            roofs.device: roofs.speed_drift
            for roofs in read_roofs(HARDWARE_ROOFS).devices
            if roofs.speed_drift.half_width_pct > 0 and math.isfinite(roofs.speed_drift.half_width_pct)
        }
    else:
        missing.append(f"`{HARDWARE_ROOFS}` is missing: run `dvc repro roofs`.")
    model_summary = read_text(SUMMARY_MARKDOWN, "export_graph") if SUMMARY_MARKDOWN.exists() else None
    if model_summary is None:
        missing.append(f"`{SUMMARY_MARKDOWN}` is missing: run `dvc repro export_graph`.")
    model_layers = read_model_layers() if SUMMARY_JSON.exists() else None  # beside summary.md, named missing above
    return ReportInputs(
        hardware=read_json(HARDWARE_FINGERPRINT, "validate", missing, texts=HARDWARE_TEXTS),
        train_metrics=read_json(TRAIN_METRICS, "train", missing, numbers=TRAIN_METRIC_NUMBERS),
        train_speed=read_json(TRAIN_SPEED, "train", missing, numbers=("images_per_second",)),
        graph_metrics=read_json(GRAPH_METRICS, "export_graph", missing, numbers=("total_parameters",)),
        model_summary=model_summary,
        profiles=profiles.records,
        comparisons=profiles.comparisons,
        drift=drift,
        missing=missing,
        model_layers=model_layers,
        tensorboard=installed_version("tensorboard"),
    )


def installed_version(package: str) -> str | None:
    """`package`'s installed version (its metadata, without importing it); None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_model_layers() -> list[dict[str, Any]]:
    """graph/summary.json's layers, each with its name, kind, parameters and forward FLOPs per sample (checked: a
    damaged file stops the stage with the stage that rewrites it)."""
    layers = read_json_object(SUMMARY_JSON, "export_graph").get("layers")
    fields = {"layer": str, "kind": str, "parameters": int, "flops_per_sample": int}
    if not isinstance(layers, list) or not all(
        isinstance(layer, dict) and all(isinstance(layer.get(key), kind) for key, kind in fields.items())
        for layer in layers
    ):
        raise PipelineError(f"{SUMMARY_JSON} has no list of layers with {', '.join(fields)}; {rerun('export_graph')}")
    return [{key: layer[key] for key in fields} for layer in layers]


def drift_sentence(drift: dict[str, SpeedDrift], comparisons: Sequence[DeviceComparisons] = ()) -> str:
    """The machine's drift, said once: a property of the machine, not of any row. What the probe measured (one more
    window of its span, predicted from its windows) is said apart from what it is used for (a rerun), and so is
    what it cannot tell: how the speed moves over spans longer than its own."""
    if not drift:
        return (
            "Every interval in this report is within this run: how far a rerun would move the rows was not measured "
            "(`profile.drift_probe_s: 0`).\n"
        )
    around = " of the windows' geometric mean"  # the prediction's centre (records.statistics.prediction_interval)
    sizes = ", ".join(
        f"±{rounded_up(probe.half_width_pct, 1):.1f} %{around if index == 0 else ''} on the {device} "
        f"({len(probe.window_medians_ms)} windows of {probe.window_s:g} s)"
        for index, (device, probe) in enumerate(sorted(drift.items()))
    )
    comparison = section_reference("comparison")
    return (
        "**Timed on a fixed workload in consecutive windows by the `roofs` stage (`profile.drift_probe_s`), the "
        f"machine's speed in one more window would lie within {sizes}** (95 % prediction). A rerun can move every "
        "row together by as much if the machine's load varies as it did during the probe "
        f"({' and '.join(f'{span:g} s' for span in probe_spans(drift))}); how the speed moves over longer spans, the "
        "probe cannot tell. "
        f"{_wider_than_the_probe_sentence(drift, comparisons)}"
        f"Each row's own interval ({comparison}) is the spread within "
        f"this run. The paired ratios ({comparison}) cancel whatever slows all combinations of a device alike; a "
        "slowdown that hits some combinations more than others (a neighbour on the host competing for memory "
        "bandwidth slows the large batches more) does not cancel, and can move a rerun's ratios outside these "
        "intervals.\n"
    )


@dataclass(frozen=True)
class WiderThanTheProbe:
    """A device whose timing processes spread measurably wider than its drift probe's windows."""

    device: str
    processes: int
    windows: int
    variance_ratio: float  # of the processes' log time factors over the windows' log medians
    bound: float  # the one-sided 95 % F bound it exceeds


def wider_than_the_probe(
    drift: dict[str, SpeedDrift], comparisons: Sequence[DeviceComparisons]
) -> list[WiderThanTheProbe]:
    """Where this run's timing processes spread measurably wider than the probe's windows: the probe's premise (the
    load varies as it did during the probe) did not hold while profiling, which a reader of its figure must know.
    Measurably: the variance of the processes' log time factors over the windows' log medians beyond the one-sided
    95 % F bound. Not their prediction half-widths, which differ with the number of values alone (Student's t)."""
    from scipy.stats import f as f_distribution  # type: ignore[import-untyped]  # lazy: only where a probe ran

    wider = []
    for found in comparisons:
        probe, factors = drift.get(found.device), found.process_speeds
        if probe is None or len(factors) < 2 or min(factors) <= 0 or probe.spread_pct <= 0:
            continue
        ratio = statistics.variance(math.log(f) for f in factors) / (probe.spread_pct / 100) ** 2
        bound = float(f_distribution.ppf(0.95, len(factors) - 1, len(probe.window_medians_ms) - 1))
        if ratio > bound:
            wider.append(WiderThanTheProbe(found.device, len(factors), len(probe.window_medians_ms), ratio, bound))
    return wider


def _wider_than_the_probe_sentence(drift: dict[str, SpeedDrift], comparisons: Sequence[DeviceComparisons]) -> str:
    wider = [
        f"on the {found.device}, the variance of the logarithms of its {found.processes} processes' shared time "
        f"factors is {found.variance_ratio:.1f}x that of its {found.windows} windows, beyond the one-sided 95 % F "
        f"bound of {found.bound:.1f}"
        for found in wider_than_the_probe(drift, comparisons)
    ]
    if not wider:
        return ""
    return (
        f"This run's timing processes spread wider than the probe's windows ({section_reference('comparison')}; "
        f"{'; '.join(wider)}): the machine's speed varied more while the profile stage timed than during the probe, "
        "so a rerun can move the rows by more than the probe says. "
    )


def probe_spans(drift: dict[str, SpeedDrift]) -> list[float]:
    """How long the drift probes ran, in seconds: one figure where every device's probe ran as long (one
    `profile.drift_probe_s`)."""
    return sorted({probe.window_s * len(probe.window_medians_ms) for probe in drift.values()})


def gpu_names(hardware: dict[str, str]) -> list[str]:
    """The fingerprint's GPUs, one name per GPU (`gpus` is comma-separated, `none` without one)."""
    names = (name.strip() for name in hardware.get("gpus", "none").split(","))
    return [name for name in names if name and name != "none"]


def cuda_runtime(profiles: Sequence[ProfileRecord]) -> str | None:
    """The CUDA runtime the GPU profiles ran with; None where no GPU was profiled."""
    return next((p.hardware["cuda_runtime"] for p in profiles if p.hardware.get("cuda_runtime")), None)


def environment_markdown(hardware: dict[str, str], profiles: Sequence[ProfileRecord]) -> str:
    gpus = gpu_names(hardware)
    runtime = cuda_runtime(profiles)
    rows = [
        ("CPU model", hardware[CPU_MODEL]),
        ("CPU family, model", hardware.get("cpu_family_model", "not recorded")),
        ("CPU features that choose kernels", hardware.get("cpu_features", "not recorded")),
        ("vCPUs", hardware["cpu_count"]),
        ("GPU model", ", ".join(sorted(set(gpus))) or "none"),
        ("GPU count", str(len(gpus))),
        ("OS", f"{hardware['os']} ({hardware['machine']})"),
        ("Python", hardware["python"]),
        ("PyTorch", hardware["torch"]),
        ("torchvision", hardware["torchvision"]),
        ("CUDA (torch build)", hardware["torch_cuda_build"]),
        ("CUDA (runtime used)", runtime or "not used: no GPU profile"),
        ("Memory allocator (profiles)", "; ".join(sorted({p.settings.allocator for p in profiles})) or "no profile"),
    ]
    return "| item | value |\n| --- | --- |\n" + "".join(f"| {name} | {value} |\n" for name, value in rows)


@dataclass(frozen=True)
class Report:
    markdown: str
    rows: list[ComparisonRow]
    inputs: ReportInputs
    findings: list[Finding] = field(default_factory=list)  # the analysis, which every hand-in words again

    def comparison_csv_rows(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(row) for row in self.rows]


def report_input_runs(report: Report) -> dict[str, Path]:
    """The MLflow run names (stage runs) whose outputs this report read, each with a file of theirs it read (by
    which lineage.producer_run finds the run that wrote it): train, export_graph and one `profile@<combination>`
    per profiled combination; those whose file is missing (listed under Missing inputs) left out."""
    read = {
        "train": TRAIN_SPEED,
        "export_graph": GRAPH_METRICS,
        **{row.combination.run_name: row.combination.outputs.record for row in report.rows},
    }
    return {name: path for name, path in read.items() if path.is_file()}


@dataclass(frozen=True)
class ReportContext:
    """What every section builder reads: the params, the inputs, and what is derived from them once."""

    params: Params
    inputs: ReportInputs
    rows: list[ComparisonRow]
    facts: list[StepFacts]
    found: list[Finding]
    figures: Path  # the folder the builders draw their figures into


@dataclass(frozen=True)
class Section:
    """One section of the report. `key` names it in code, tests and references (`section_reference`); the
    renderer numbers the sections that apply in order, so a section is added by one entry in SECTIONS."""

    key: str
    title: str
    build: Callable[[ReportContext], list[str] | None]  # the body's markdown blocks; None: the section does not apply


REFERENCE = re.compile("\x00([a-z_]+)\x00")


def section_reference(key: str) -> str:
    """The words "section N" for the section `key`, N filled in by `render_sections` once the sections are numbered
    (a reference to a section that does not apply is a KeyError there)."""
    return f"\x00{key}\x00"


def render_sections(sections: Sequence[Section], context: ReportContext) -> list[str]:
    """Each section that applies, in order, under its heading "## N. Title", every `section_reference` resolved."""
    built = [(section, body) for section in sections if (body := section.build(context)) is not None]
    number = {section.key: index for index, (section, _) in enumerate(built, 1)}
    blocks = [block for section, body in built for block in (f"## {number[section.key]}. {section.title}\n", *body)]
    return [REFERENCE.sub(lambda reference: f"section {number[reference[1]]}", block) for block in blocks]


def build_report(params: Params, figures: Path) -> Report:
    """Write the figures into `figures` (a folder) and return the markdown report and the comparison rows."""
    inputs = read_inputs(params.profile)
    rows = comparison_rows(inputs.profiles)
    data = AnalysisData.of(inputs.profiles, inputs.comparisons, inputs.train_speed, params.train.batch_size)
    found = findings(data)
    found = [*conclusion(data, found), *found]  # the opening first: the analysis says it first
    context = ReportContext(params, inputs, rows, step_facts(inputs.profiles), found, figures)
    blocks = [
        f"# {TITLE}\n",
        "Generated by the `report` stage from the pipeline's outputs; every number below is read from them.\n",
        *render_sections(SECTIONS, context),
    ]
    if inputs.missing:
        blocks.append("## Missing inputs\n")
        blocks.append("".join(f"- {line}\n" for line in inputs.missing))
    return Report("\n".join(blocks), rows, inputs, found)


def environment_section(context: ReportContext) -> list[str]:
    inputs = context.inputs
    if not inputs.hardware:
        return ["_Not available (see Missing inputs)._\n"]
    return [
        environment_markdown(inputs.hardware, inputs.profiles) + "\n" + drift_sentence(inputs.drift, inputs.comparisons)
    ]


def graph_section(context: ReportContext) -> list[str]:
    if GRAPH_SVG.exists():
        shutil.copy(GRAPH_SVG, context.figures / PurePosixPath(GRAPH_FIGURE).name)
        blocks = [f"![dataflow graph]({GRAPH_FIGURE})\n"]
    else:
        blocks = ["_Graph picture not available (see Missing inputs)._\n"]
    return [*blocks, context.inputs.model_summary or "_Model summary not available (see Missing inputs)._\n"]


def operators_section(context: ReportContext) -> list[str]:
    blocks = []
    for record in context.inputs.profiles:
        outputs = record.combination.outputs
        blocks.append(outputs.table_markdown.read_text().replace("### ", "#### ", 1))
        if record.analysis.top_kernels:
            blocks.append(outputs.kernel_table_markdown.read_text().replace("### ", "#### ", 1))
    if not context.inputs.profiles:
        blocks.append("_No profile available (see Missing inputs)._\n")
    return blocks


def comparison_section(context: ReportContext) -> list[str]:
    rows, comparisons, figures = context.rows, context.inputs.comparisons, context.figures
    if not rows:
        return []
    blocks = [comparison_markdown(rows, comparisons if comparisons else None)]
    if comparisons:
        blocks.append("### Paired ratios\n")
        blocks.append(
            "All combinations of a device were timed interleaved, round by round in random order, in the same "
            "fresh processes: each ratio below is the median of the processes' ratios, its 95 % CI their spread "
            "(per sample: the larger batch over the smaller; per step: train over inference).\n"
        )
        if any(found.parts for found in comparisons):
            blocks.append(
                f"The rows with `{GRADIENTS}` are the training step's parts, timed the same way: the training step "
                "without its optimizer update (the train-mode forward, the loss, backward and clearing the "
                "gradients); the full step over it gives what leaving the update out saves (1 - 1/ratio of the step), "
                "it over inference the step without the update against inference.\n"
            )
        blocks.append(comparisons_table(comparisons))
        blocks.append("".join(f"{process_speed_sentence(found)}\n" for found in comparisons))
    plotted = [dataclasses.asdict(row) for row in rows]
    batch_size_plot(plotted, "per_sample_ms", "per-sample time (ms)", figures / "per_sample_time.png")
    batch_size_plot(plotted, "throughput_samples_per_s", "throughput (samples/s)", figures / "throughput.png")
    blocks.append("![per-sample time](figures/per_sample_time.png)\n\n![throughput](figures/throughput.png)\n")
    return blocks


def allocator_section(context: ReportContext) -> list[str]:
    return [allocator_markdown(context.inputs.profiles)]


def memory_energy_section(context: ReportContext) -> list[str]:
    return memory_section(context.inputs.profiles, context.figures)


def analysis_section(context: ReportContext) -> list[str]:
    if not context.rows:
        return ["_No profiles to analyse._\n"]
    inputs = context.inputs
    analysis = analysis_markdown(context.found, inputs, context.params, load_catalogue("en"), full_report=False)
    sentences = step_sentences(context.facts) + allocator_sentences(inputs.profiles)
    return [analysis, "Also measured:\n\n" + "".join(f"- {sentence}\n" for sentence in sentences)]


def conditions_line(inputs: ReportInputs, params: Params, catalogue: Catalogue) -> str | None:
    """The conditions every number of the analysis comes from, said once; None where the inputs lack them."""
    if not inputs.profiles or not inputs.train_speed:
        return None
    settings = inputs.profiles[0].settings
    ran = inputs.train_speed.get("runtime", {})
    return catalogue(
        "conditions",
        profile_threads=settings.threads,
        profile_precision=settings.precision,
        lr=settings.optimizer_lr,
        epochs=params.train.epochs,
        batch=params.train.batch_size,
        train_threads=ran.get("threads", params.train.threads),
        train_precision=ran.get("precision", params.train.precision),
        processes=settings.processes,
        traced_steps=settings.active_steps,
    )


def analysis_markdown(
    found: Sequence[Finding], inputs: ReportInputs, params: Params, catalogue: Catalogue, *, full_report: bool
) -> str:
    """The findings as a list in `catalogue`'s language, after the conditions they hold under (and, in a hand-in, the
    one line saying where the full report is)."""
    opening = [each.render(catalogue) for each in found if each.kind == "conclusion"]
    lines = [catalogue("conclusion_lead") + catalogue("sentence_joiner").join(opening)] if opening else []
    lines += [line for line in (conditions_line(inputs, params, catalogue),) if line]
    if full_report:
        lines.append(catalogue("full_report_line"))
    body = "".join(f"- {finding.render(catalogue)}\n" for finding in found if finding.kind != "conclusion")
    return "\n\n".join(lines) + "\n\n" + body


def anatomy_section(context: ReportContext) -> list[str]:
    return [anatomy_markdown(context.facts)]


def flop_rate_section(context: ReportContext) -> list[str]:
    """Achieved FLOP/s against the peak, then the roofline of whole steps and operators under both roofs."""
    facts, figures = context.facts, context.figures
    blocks = [flop_rate_markdown(facts)]
    if facts:
        peaks: dict[str, list[float]] = {}
        for fact in facts:
            if fact.rate is not None and fact.rate.peak_gflops_per_s > 0:
                peaks.setdefault(fact.device, []).append(fact.rate.peak_gflops_per_s)
        roofline_figure(facts, {device: statistics.median(v) for device, v in peaks.items()}, figures / "roofline.png")
        blocks.append("![achieved FLOP/s vs batch size](figures/roofline.png)\n")
    points = roofline_points(context.inputs.profiles)
    blocks += ["### The roofline: arithmetic intensity under both roofs\n", roofline_markdown(points)]
    if points:
        roofline_chart(points, figures / "roofline_intensity.png")
        blocks.append("![roofline: GFLOP/s against FLOP/byte under both roofs](figures/roofline_intensity.png)\n")
    return blocks


def cpu_vs_gpu_section(context: ReportContext) -> list[str]:
    blocks = [cpu_vs_gpu_markdown(context.facts)]
    if has_gpu_pairs(context.facts):
        cpu_vs_gpu_figure(context.facts, context.figures / "cpu_vs_gpu.png")
        blocks.append("![per-sample time, CPU vs GPU](figures/cpu_vs_gpu.png)\n")
    return blocks


def training_section(context: ReportContext) -> list[str]:
    inputs, figures = context.inputs, context.figures
    train = context.params.train
    ran = dict(inputs.train_speed.get("runtime", {})) if inputs.train_speed else {}

    def setting(key: str) -> str:
        """What ran (metrics/train_speed.json), with the params.yaml request where that said something else."""
        asked = str(getattr(train, key))
        done = str(ran.get(key, asked))
        return f"`{done}`" + (f" (`{asked}` in params.yaml)" if done != asked else "")

    sections = [
        f"Adadelta (lr {train.lr:g}), StepLR gamma {train.gamma:g}, batch {train.batch_size}, {train.epochs} epoch(s), "
        f"seed {train.seed}, device {setting('device')}, precision {setting('precision')}, "
        f"execution {setting('execution')}, {setting('threads')} thread(s).\n",
    ]
    if inputs.train_metrics and TRAIN_EPOCHS_PLOT.exists() and TRAIN_STEPS_PLOT.exists():
        metrics = inputs.train_metrics
        speed = (
            f" Training ran at {inputs.train_speed['images_per_second']:.0f} images/s." if inputs.train_speed else ""
        )
        if inputs.train_speed and inputs.train_speed.get("machine_busy"):
            speed += (
                f" **The machine was busy while training** (its threads got {inputs.train_speed['cpu_share']:.0%} of "
                "their CPUs): that speed is not this machine's; the model and its metrics are unaffected."
            )
        on_images = f" (first {train.test_samples:,} test images)" if train.test_samples else ""
        sections.append(
            f"Test accuracy **{metrics['test_accuracy']:.4f}**{on_images}, test loss {metrics['test_loss']:.4f}; "
            f"last-epoch train accuracy {metrics['train_accuracy']:.4f}, loss {metrics['train_loss']:.4f}.{speed}\n"
        )
        training_curves(read_csv(TRAIN_EPOCHS_PLOT), read_csv(TRAIN_STEPS_PLOT), figures / "training_curves.png")
        sections.append("![training curves](figures/training_curves.png)\n")
    else:
        sections.append("_Training curves not available (see Missing inputs)._\n")
    return sections


SECTIONS = (  # the report's sections in order; the renderer numbers them
    Section("environment", "Environment", environment_section),
    Section("graph", "Model and dataflow graph", graph_section),
    Section("training", "Training", training_section),
    Section("operators", "Top operators (and GPU kernels) per combination", operators_section),
    Section("comparison", "Comparison across batch sizes and devices", comparison_section),
    Section("step_anatomy", "Step anatomy: where a step's time goes", anatomy_section),
    Section("flop_rate", "Achieved FLOP/s against the measured matmul roof", flop_rate_section),
    Section("cpu_vs_gpu", "CPU vs GPU", cpu_vs_gpu_section),
    Section("allocator", "Memory allocator: glibc's defaults against the tuned allocator", allocator_section),
    Section("memory_energy", "Memory and energy per step", memory_energy_section),
    Section("analysis", "Analysis", analysis_section),
)
