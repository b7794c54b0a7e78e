"""The lab report, generated from the stage outputs: environment, graph, training, profiles, analysis.

Every number in it is read from a stage output (nothing is re-measured), and every input that is
missing is named in the report with the command that produces it, never silently dropped.
Torch-free: profiles are read through `pipeline.profile_record`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.analysis_figures import cpu_vs_gpu_figure, roofline_figure
from pipeline.config import Params, ProfileConfig
from pipeline.paths import (
    GRAPH_METRICS,
    GRAPH_SVG,
    HARDWARE_FINGERPRINT,
    SUMMARY_MARKDOWN,
    TRAIN_EPOCHS_PLOT,
    TRAIN_METRICS,
    TRAIN_SPEED,
    TRAIN_STEPS_PLOT,
    profile_outputs,
)
from pipeline.profile_record import ProfileRecord, combinations, read_record
from pipeline.report_figures import batch_size_plot, read_csv, training_curves
from pipeline.step_report import (
    StepFacts,
    analysis_sentences,
    anatomy_markdown,
    cpu_vs_gpu_markdown,
    flop_rate_markdown,
    has_gpu_pairs,
    kernels_markdown,
    step_facts,
)
from pipeline.timing_statistics import NOISY_ADVICE, Interval, ratio

TITLE = "AI-System Lab 1: MNIST CNN — training, dataflow graph and operator profile"
CONVOLUTION = re.compile(r"conv", re.IGNORECASE)
GRAPH_FIGURE = "figures/model_graph.svg"


@dataclass
class ReportInputs:
    hardware: dict[str, str] | None
    train_metrics: dict[str, float] | None
    train_speed: dict[str, Any] | None  # images_per_second, train_seconds, runtime (what ran)
    graph_metrics: dict[str, float] | None
    model_summary: str | None
    profiles: list[ProfileRecord]  # in params order
    missing: list[str] = field(default_factory=list)  # one sentence per absent input


def read_json(path: Path, producer: str, missing: list[str]) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        missing.append(f"`{path}` is missing: run `dvc repro {producer}`.")
        return None


def read_inputs(config: ProfileConfig) -> ReportInputs:
    missing: list[str] = []
    profiles = []
    for combination in combinations(config):
        path = profile_outputs(combination.name).record
        if path.exists():
            profiles.append(read_record(path, combination))
        else:
            missing.append(f"`{path}` is missing: run `dvc repro profile@{combination.name}`.")
    model_summary = SUMMARY_MARKDOWN.read_text() if SUMMARY_MARKDOWN.exists() else None
    if model_summary is None:
        missing.append(f"`{SUMMARY_MARKDOWN}` is missing: run `dvc repro export_graph`.")
    return ReportInputs(
        hardware=read_json(HARDWARE_FINGERPRINT, "hardware", missing),
        train_metrics=read_json(TRAIN_METRICS, "train", missing),
        train_speed=read_json(TRAIN_SPEED, "train", missing),
        graph_metrics=read_json(GRAPH_METRICS, "export_graph", missing),
        model_summary=model_summary,
        profiles=profiles,
        missing=missing,
    )


@dataclass(frozen=True)
class ComparisonRow:
    """One profiled combination in the report's comparison table and `plots/profile_comparison.csv`."""

    batch_size: int
    device: str
    mode: str
    series: str  # one plotted line: "<device> <mode>"
    step_time_ms: float  # median per-step time
    step_time_ms_iqr: float
    step_time_ms_ci_low: float  # its 95 % confidence interval
    step_time_ms_ci_high: float
    step_time_ci_pct: float
    steps_measured: int
    blocks_measured: int
    per_sample_ms: float
    throughput_samples_per_s: float
    noisy: bool  # the interval missed profile.ci_target_pct
    machine_busy: bool  # load average above the cores while timing
    load_average_before: float
    load_average_after: float
    cores: int
    threads: int
    top_operator: str
    top_operator_share_pct: float
    convolution_share_pct: float

    @property
    def step_interval(self) -> Interval:
        return Interval(self.step_time_ms, self.step_time_ms_ci_low, self.step_time_ms_ci_high)

    @property
    def per_sample_interval(self) -> Interval:
        return self.step_interval.scaled(1.0 / self.batch_size)

    @property
    def flags(self) -> str:
        return ", ".join(flag for flag, raised in (("noisy", self.noisy), ("busy", self.machine_busy)) if raised)


# Columns of plots/profile_comparison.csv (what `dvc plots show` draws).
COMPARISON_PLOT_FIELDS = (
    "batch_size",
    "series",
    "per_sample_ms",
    "throughput_samples_per_s",
    "step_time_ms",
    "step_time_ms_ci_low",
    "step_time_ms_ci_high",
)


def comparison_rows(profiles: Sequence[ProfileRecord]) -> list[ComparisonRow]:
    rows = []
    for record in profiles:
        combination, timing, conditions = record.combination, record.timing, record.conditions
        top = record.top_operators
        rows.append(
            ComparisonRow(
                batch_size=combination.batch_size,
                device=combination.device,
                mode=combination.mode,
                series=f"{combination.device} {combination.mode}",
                step_time_ms=timing.step_time_ms_median,
                step_time_ms_iqr=timing.step_time_ms_iqr,
                step_time_ms_ci_low=timing.step_time_ms_ci_low,
                step_time_ms_ci_high=timing.step_time_ms_ci_high,
                step_time_ci_pct=timing.step_time_ci_pct,
                steps_measured=timing.steps_measured,
                blocks_measured=timing.blocks_measured,
                per_sample_ms=timing.per_sample_ms,
                throughput_samples_per_s=timing.throughput_samples_per_s,
                noisy=timing.noisy,
                machine_busy=conditions.busy,
                load_average_before=conditions.load_average_before,
                load_average_after=conditions.load_average_after,
                cores=conditions.cores,
                threads=conditions.threads,
                top_operator=top[0].operator if top else "",
                top_operator_share_pct=top[0].share_pct if top else 0.0,
                convolution_share_pct=sum(row.share_pct for row in top if CONVOLUTION.search(row.operator)),
            )
        )
    return rows


def comparison_markdown(rows: Sequence[ComparisonRow]) -> str:
    lines = [
        "| batch | device | mode | step ms (median) | IQR ms | 95 % CI | steps / blocks | per-sample ms | samples/s "
        "| top operator (share) | convolution share | flag |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row.batch_size} | {row.device} | {row.mode} | {row.step_time_ms:.3f} | {row.step_time_ms_iqr:.3f} | "
            f"±{row.step_time_ci_pct:.1f} % | {row.steps_measured} / {row.blocks_measured} | {row.per_sample_ms:.4f} | "
            f"{row.throughput_samples_per_s:.0f} | `{row.top_operator}` ({row.top_operator_share_pct:.1f} %) | "
            f"{row.convolution_share_pct:.1f} % | {row.flags} |"
        )
    return "\n".join(lines) + "\n" + "".join(f"\n{note}\n" for note in measurement_notes(rows))


def measurement_notes(rows: Sequence[ComparisonRow]) -> list[str]:
    """What the comparison table's numbers are, and what its flags mean where any row raised one."""
    notes = [
        "Step time: median of per-step block means (blocks of consecutive steps timed together), with the "
        "half-width of its 95 % confidence interval; IQR is the spread of the blocks."
    ]
    noisy = [f"{row.batch_size}-{row.device}-{row.mode}" for row in rows if row.noisy]
    if noisy:
        notes.append(
            f"**{NOISY_ADVICE}** ({', '.join(noisy)}): the confidence interval missed `profile.ci_target_pct` "
            "before `profile.time_budget_s` ran out."
        )
    busy = [row for row in rows if row.machine_busy]
    if busy:
        loads = ", ".join(
            f"{row.batch_size}-{row.device}-{row.mode} ({row.load_average_before:.2f} -> {row.load_average_after:.2f})"
            for row in busy
        )
        notes.append(
            f"**Warning: busy machine**: the load average exceeded the {busy[0].cores} cores while timing {loads}; "
            "those step times are likely inflated and less stable: rerun on a quiet machine."
        )
    return notes


def environment_markdown(hardware: dict[str, str], profiles: Sequence[ProfileRecord]) -> str:
    gpus = [name.strip() for name in hardware.get("gpus", "none").split(",") if name.strip() and name.strip() != "none"]
    cuda_runtime = next((p.hardware["cuda_runtime"] for p in profiles if p.hardware.get("cuda_runtime")), None)
    rows = [
        ("CPU model", hardware["cpu"]),
        ("vCPUs", hardware["cpu_count"]),
        ("GPU model", ", ".join(sorted(set(gpus))) or "none"),
        ("GPU count", str(len(gpus))),
        ("OS", f"{hardware['os']} ({hardware['machine']})"),
        ("Python", hardware["python"]),
        ("PyTorch", hardware["torch"]),
        ("torchvision", hardware["torchvision"]),
        ("CUDA (torch build)", hardware["torch_cuda_build"]),
        ("CUDA (runtime used)", cuda_runtime or "not used: no GPU profile"),
    ]
    return "| item | value |\n| --- | --- |\n" + "".join(f"| {name} | {value} |\n" for name, value in rows)


def analysis(rows: Sequence[ComparisonRow]) -> list[str]:
    """Plain sentences drawn from the comparison numbers; every ratio with its 95 % interval."""
    sentences: list[str] = []
    by_series: dict[tuple[str, str], list[ComparisonRow]] = {}
    for row in rows:
        by_series.setdefault((row.device, row.mode), []).append(row)
    for (device, mode), series in sorted(by_series.items()):
        series.sort(key=lambda row: row.batch_size)
        largest, smallest = series[-1], series[0]
        sentences.append(
            f"**{device} {mode}**: at batch {largest.batch_size} the top operator is `{largest.top_operator}` "
            f"({largest.top_operator_share_pct:.1f} % of the step) and convolution operators together take "
            f"{largest.convolution_share_pct:.1f} % of it."
        )
        if len(series) > 1:
            sentences.append(batch_scaling_sentence(smallest, largest, mode))
    return sentences


def batch_scaling_sentence(smallest: ComparisonRow, largest: ComparisonRow, mode: str) -> str:
    """Per-sample time from the smallest to the largest batch, with the ratio's 95 % interval."""
    cheaper = ratio(smallest.per_sample_interval, largest.per_sample_interval)
    small, large = f"batch {smallest.batch_size}", f"batch {largest.batch_size}"
    if not cheaper.measurable:
        return (
            f"Per-sample time at {small} ({smallest.per_sample_ms:.4f} ms) and at {large} "
            f"({largest.per_sample_ms:.4f} ms): {cheaper.describe()}."
        )
    if cheaper.value < 1:
        return (
            f"Per-sample time rises from {smallest.per_sample_ms:.4f} ms at {small} to {largest.per_sample_ms:.4f} ms "
            f"at {large} ({1 / cheaper.value:.1f}x dearer, 95 % CI {1 / cheaper.high:.2f}-{1 / cheaper.low:.2f}x)."
        )
    return (
        f"Per-sample time falls from {smallest.per_sample_ms:.4f} ms at {small} to {largest.per_sample_ms:.4f} ms at "
        f"{large} ({cheaper.value:.1f}x cheaper, 95 % CI {cheaper.bounds()}): fixed per-step costs (operator "
        f"dispatch, {'the optimizer update, ' if mode == 'train' else ''}kernel set-up) are shared by more samples, "
        f"and at {small} the top operator is `{smallest.top_operator}`."
    )


@dataclass(frozen=True)
class Report:
    markdown: str
    rows: list[ComparisonRow]

    def comparison_csv_rows(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(row) for row in self.rows]


def report_input_runs(report: Report) -> list[str]:
    """The MLflow run names (stage runs) whose outputs this report read: train, export_graph and one
    `profile@<combination>` per profiled combination."""
    profiles = [f"profile@{row.batch_size}-{row.device}-{row.mode}" for row in report.rows]
    return ["train", "export_graph", *profiles]


def build_report(params: Params, figures: Path) -> Report:
    """Write the figures into `figures` (a folder) and return the markdown report and the comparison rows."""
    inputs = read_inputs(params.profile)
    rows = comparison_rows(inputs.profiles)
    sections = [
        f"# {TITLE}\n",
        "Generated by the `report` stage from the pipeline's outputs; every number below is read from them.\n",
        "## 1. Environment\n",
        environment_markdown(inputs.hardware, inputs.profiles)
        if inputs.hardware
        else "_Not available (see Missing inputs)._\n",
        "## 2. Model and dataflow graph\n",
    ]
    if GRAPH_SVG.exists():
        shutil.copy(GRAPH_SVG, figures / PurePosixPath(GRAPH_FIGURE).name)
        sections.append(f"![dataflow graph]({GRAPH_FIGURE})\n")
    else:
        sections.append("_Graph picture not available (see Missing inputs)._\n")
    sections.append(inputs.model_summary or "_Model summary not available (see Missing inputs)._\n")
    sections += training_section(params, inputs, figures)

    sections.append("## 4. Top operators (and GPU kernels) per combination\n")
    for record in inputs.profiles:
        table = profile_outputs(record.combination.name).table_markdown.read_text()
        sections.append(table.replace("### ", "#### ", 1))
        if record.analysis.top_kernels:
            sections.append(kernels_markdown(record).replace("### ", "#### ", 1))
    if not inputs.profiles:
        sections.append("_No profile available (see Missing inputs)._\n")

    sections.append("## 5. Comparison across batch sizes and devices\n")
    if rows:
        sections.append(comparison_markdown(rows))
        plotted = [dataclasses.asdict(row) for row in rows]
        batch_size_plot(plotted, "per_sample_ms", "per-sample time (ms)", figures / "per_sample_time.png")
        batch_size_plot(plotted, "throughput_samples_per_s", "throughput (samples/s)", figures / "throughput.png")
        sections.append("![per-sample time](figures/per_sample_time.png)\n\n![throughput](figures/throughput.png)\n")

    facts = step_facts(inputs.profiles)
    sections += step_sections(facts, figures)

    sections.append("## 9. Analysis\n")
    sentences = analysis(rows) + analysis_sentences(facts)
    sections.append("".join(f"- {sentence}\n" for sentence in sentences) if rows else "_No profiles to analyse._\n")

    if inputs.missing:
        sections.append("## Missing inputs\n")
        sections.append("".join(f"- {line}\n" for line in inputs.missing))
    return Report("\n".join(sections), rows)


def step_sections(facts: Sequence[StepFacts], figures: Path) -> list[str]:
    """Sections 6-8: where each step's time goes, its achieved FLOP/s against the peak, CPU vs GPU."""
    sections = ["## 6. Step anatomy: where a step's time goes\n", anatomy_markdown(facts)]
    sections += ["## 7. Achieved FLOP/s against the device's peak\n", flop_rate_markdown(facts)]
    if facts:
        peaks: dict[str, list[float]] = {}
        for fact in facts:
            if fact.rate is not None and fact.rate.peak_gflops_per_s > 0:
                peaks.setdefault(fact.device, []).append(fact.rate.peak_gflops_per_s)
        roofline_figure(facts, {device: statistics.median(v) for device, v in peaks.items()}, figures / "roofline.png")
        sections.append("![achieved FLOP/s vs batch size](figures/roofline.png)\n")
    sections += ["## 8. CPU vs GPU\n", cpu_vs_gpu_markdown(facts)]
    if has_gpu_pairs(facts):
        cpu_vs_gpu_figure(facts, figures / "cpu_vs_gpu.png")
        sections.append("![per-sample time, CPU vs GPU](figures/cpu_vs_gpu.png)\n")
    return sections


def training_section(params: Params, inputs: ReportInputs, figures: Path) -> list[str]:
    train = params.train
    ran = dict(inputs.train_speed.get("runtime", {})) if inputs.train_speed else {}

    def setting(key: str) -> str:
        """What ran (metrics/train_speed.json), with the params.yaml request where that said something else."""
        asked = str(getattr(train, key))
        done = str(ran.get(key, asked))
        return f"`{done}`" + (f" (`{asked}` in params.yaml)" if done != asked else "")

    sections = [
        "## 3. Training\n",
        f"Adadelta (lr {train.lr:g}), StepLR gamma {train.gamma:g}, batch {train.batch_size}, {train.epochs} epoch(s), "
        f"seed {train.seed}, device {setting('device')}, precision {setting('precision')}, "
        f"execution {setting('execution')}, {setting('threads')} thread(s).\n",
    ]
    if inputs.train_metrics and TRAIN_EPOCHS_PLOT.exists() and TRAIN_STEPS_PLOT.exists():
        metrics = inputs.train_metrics
        speed = (
            f" Training ran at {inputs.train_speed['images_per_second']:.0f} images/s." if inputs.train_speed else ""
        )
        sections.append(
            f"Test accuracy **{metrics['test_accuracy']:.4f}**, test loss {metrics['test_loss']:.4f}; last-epoch train "
            f"accuracy {metrics['train_accuracy']:.4f}, loss {metrics['train_loss']:.4f}.{speed}\n"
        )
        training_curves(read_csv(TRAIN_EPOCHS_PLOT), read_csv(TRAIN_STEPS_PLOT), figures / "training_curves.png")
        sections.append("![training curves](figures/training_curves.png)\n")
    else:
        sections.append("_Training curves not available (see Missing inputs)._\n")
    return sections


def embed_images(html: str, folder: Path) -> str:
    """Replace `src="figures/x.png"` with data URIs so the HTML file stands alone."""

    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(1)
        if not path.exists():
            return match.group(0)
        kind = "image/svg+xml" if path.suffix == ".svg" else "image/png"
        return f'src="data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    return re.sub(r'src="([^"]+)"', inline, html)


HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; }}
th {{ background: #f3f3f3; }}
code {{ background: #f6f6f6; padding: 0 0.2em; }}
img {{ max-width: 100%; }}
</style></head><body>
{body}
</body></html>
"""


def markdown_to_html(markdown_text: str, title: str, folder: Path) -> str:
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code"])
    return embed_images(HTML_TEMPLATE.format(title=title, body=body), folder)


# --- the report as the tracking tools show it ------------------------------------------------------------
#
# report/report.md keeps relative `figures/*.png` images: they resolve on the forge and in an editor beside
# the folder. Neither tool resolves them, and neither shows an image written as a data: URI (read from the
# installed packages, TensorBoard 2.21 and MLflow 3.17.2):
# - TensorBoard's Text tab renders markdown through `tensorboard.plugin_util.markdown_to_safe_html`, a bleach
#   Cleaner with bleach's default protocols (http, https, mailto): `![x](data:image/png;base64,...)` and
#   `<img src="data:...">` come out as `<img alt="x">` (a broken image), and `figures/x.png` is kept but
#   resolves against TensorBoard's own address (HTTP 404). Its Images tab shows PNG summaries.
# - MLflow's artifact preview of a .md file (server/js/build chunk 9830, react-markdown) replaces an image
#   whose src has no scheme with the text `[alt](src)`, and its urlTransform (react-markdown's default,
#   allowing http(s), irc(s), mailto, xmpp) empties a data: src; files over 100 KB open as source, not
#   rendered. Its .html preview (a sandboxed iframe) shows report.html with its inlined figures.
# Both behaviours were confirmed in headless Chromium against `tensorboard` and `mlflow server`. Only an absolute
# http(s) image URL would show in both, but the stage cannot know the address either tool will be served at.
# So each tool gets a variant whose images are replaced by a line saying where the figure is shown.
FIGURE_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<path>figures/[^)\s]+)\)")
TENSORBOARD_IMAGE_PREFIX = "report/"


def figure_paths(markdown_text: str) -> list[str]:
    """The `figures/...` images the report shows, in order."""
    return [match.group("path") for match in FIGURE_IMAGE.finditer(markdown_text)]


def tensorboard_image_tag(path: str) -> str | None:
    """The Images-tab tag of a report figure (`report/<name>`); None for a non-PNG (the SVG graph), which the
    Images tab cannot show."""
    figure = PurePosixPath(path)
    return f"{TENSORBOARD_IMAGE_PREFIX}{figure.stem}" if figure.suffix == ".png" else None


def _with_note(markdown_text: str, note: str, figure_line: Callable[[str, str], str]) -> str:
    """`markdown_text` with every figure image replaced by `figure_line(alt, path)` and `note` under the title."""
    replaced = FIGURE_IMAGE.sub(lambda match: figure_line(match.group("alt"), match.group("path")), markdown_text)
    title, _, rest = replaced.partition("\n")
    return f"{title}\n\n{note}\n{rest}"


def markdown_for_tensorboard(markdown_text: str) -> str:
    """The report for TensorBoard's Text tab: each PNG figure named by its Images-tab tag (the stage logs it
    there with `tensorboard_image_tag`), the SVG graph by where it is shown; no image left to break."""

    def figure_line(alt: str, path: str) -> str:
        tag = tensorboard_image_tag(path)
        if tag is not None:
            return f"**Figure: {alt}**: TensorBoard's Images tab, tag `{tag}`."
        where = "the Graphs tab (export_graph run) shows the graph; " if path == GRAPH_FIGURE else ""
        return f"**Figure: {alt}**: {where}`{path}` is an MLflow artifact of this run and inline in `report.html`."

    note = (
        f"_Figures: TensorBoard's Images tab, tags `{TENSORBOARD_IMAGE_PREFIX}...`; "
        "`report/report.html` and the MLflow run's `report.html` show the report with every figure inline._"
    )
    return _with_note(markdown_text, note, figure_line)


def markdown_for_mlflow(markdown_text: str) -> str:
    """The report.md logged to MLflow: each figure named by its artifact path (the stage logs the figures under
    `figures/`), since MLflow's markdown preview shows no relative or data: image."""

    def figure_line(alt: str, path: str) -> str:
        return f"**Figure: {alt}**: artifact `{path}` of this run (open it in the artifact tree)."

    note = (
        "_Figures: this run's `figures/` artifacts; `report.html` beside this file shows the report with every "
        "figure inline._"
    )
    return _with_note(markdown_text, note, figure_line)
