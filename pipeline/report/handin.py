"""The hand-in: the course's Lab 1 report template (实验环境, 实验结果 1-2, and the optional GPU step), each cell
filled from the pipeline's outputs, in one language per message catalogue (pipeline/report/catalogue.py).

It states what the main report states, by the same rules: a per-sample direction only where the paired ratio's
interval excludes 1, "the data cannot tell them apart" where it does not, and a cell names the command that fills it
where its input is missing. Torch-free.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.machine import CPU_MODEL
from pipeline.common.paths import GRAPH_SVG, TRAIN_EPOCHS_PLOT, TRAIN_STEPS_PLOT
from pipeline.params.schema import Params
from pipeline.records.profile import (
    PROFILE_PRECISION,
    TRACE_ATTEMPTS,
    Combination,
    DeviceComparisons,
    PairedComparison,
)
from pipeline.records.quantities import rounded_up
from pipeline.records.statistics import MIN_ORDER_STATISTIC_PROCESSES
from pipeline.report.catalogue import HTML_LANGUAGE, Catalogue, load_catalogue
from pipeline.report.comparison import ComparisonRow, host_and_gpu_pairs
from pipeline.report.figures import read_csv
from pipeline.report.findings import MOST_PROCESSES_ADVISED, Finding, processes_to_decide
from pipeline.report.handin_analysis import handin_analysis
from pipeline.report.handin_figures import curves_figure, curves_path, operators_figure, operators_path
from pipeline.report.lab_report import (
    Report,
    ReportInputs,
    cuda_runtime,
    gpu_names,
    probe_spans,
    wider_than_the_probe,
)
from pipeline.report.operator_layers import operator_groups
from pipeline.report.rendering import GRAPH_FIGURE, markdown_to_html, with_figures_named
from pipeline.report.tensorboard_views import GRAPH_VIEW, SCALARS_VIEW, current_views, view_runs

FULL_REPORT = "report.md"  # the hand-in's link to the full report; report.html in the HTML page
TEMPLATE_BATCHES = (1, 16, 64)  # the rows of the template's batch-size table
HANDOUT_TORCH = "1.5"  # the PyTorch the course's handout names (PyTorch==1.5.0)
# The fingerprint's kernel features (pipeline.common.machine.KERNEL_FEATURES) by their instruction sets' names, each
# extension said beside its family: "AVX2, FMA, AVX-512 (VNNI, BF16)". A flag not here is said as recorded.
INSTRUCTION_SETS = {
    "avx2": ("AVX2", ""),
    "fma": ("FMA", ""),
    "avx_vnni": ("AVX-VNNI", ""),
    "avx512f": ("AVX-512", ""),
    "avx512_vnni": ("AVX-512", "VNNI"),
    "avx512_bf16": ("AVX-512", "BF16"),
    "avx512_fp16": ("AVX-512", "FP16"),
    "amx_tile": ("AMX", ""),
    "amx_bf16": ("AMX", "BF16"),
    "amx_int8": ("AMX", "INT8"),
}
# Step 5's profiler call, as pipeline/profiling/run.py's trace_steps makes it (tests/test_handin.py checks each line
# is there): the traced steps the operator tables are read from.
PROFILER_CALL = """\
with profile(
    activities=activities,
    schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
    profile_memory=True,
    acc_events=True,
) as profiler:
    for _ in range(2 + steps):
        step()
        sync()
        profiler.step()
profiler.export_chrome_trace(str(path))
"""


def linked_to_html(markdown: str) -> str:
    """The hand-in for its HTML page: the link to the full report goes to report.html."""
    return markdown.replace(f"]({FULL_REPORT})", "](report.html)")


def for_mlflow(markdown: str, catalogue: Catalogue) -> str:
    """The hand-in as MLflow's markdown preview shows it: each figure named by its artifact path (the preview
    shows no relative image); the HTML page beside it shows them inline."""
    note = catalogue("mlflow_note", page=f"handin.{catalogue.language}.html")
    return with_figures_named(markdown, note, lambda alt, path: catalogue("mlflow_figure", alt=alt, path=path))


@dataclass(frozen=True)
class HandinFigures:
    """Which of the hand-in's figures are in the figures folder (each needs its inputs)."""

    graph: bool
    curves: bool
    operators: bool
    languages: tuple[str, ...] = ()  # each language's figures are drawn apart, in its words
    views: bool = False  # TensorBoard's views (pipeline.report.tensorboard_views) copied beside them
    views_stale: str = ""  # why views/ was not used: it shows an earlier training
    view_runs: tuple[str, str] = ("", "")  # the training's and the graph export's runs the views were taken from

    @property
    def files(self) -> set[str]:
        """The file names this module drew (the graph is the main report's)."""
        drawn = [(curves_path, self.curves), (operators_path, self.operators)]
        views = {path.name for path in (GRAPH_VIEW, SCALARS_VIEW)} if self.views else set()
        return {Path(path(language)).name for language in self.languages for path, made in drawn if made} | views


@dataclass(frozen=True)
class Handin:
    """One language's hand-in, as each place shows it."""

    language: str
    markdown: str  # report/handin.<language>.md: relative figures, as on the forge
    page: str  # report/handin.<language>.html: self-contained, figures inlined
    for_mlflow: str  # the .md logged to MLflow: figures named by their artifact path

    @property
    def names(self) -> tuple[str, str]:
        return f"handin.{self.language}.md", f"handin.{self.language}.html"


def handins(report: Report, params: Params, folder: Path) -> tuple[list[Handin], HandinFigures]:
    """Every language of `report.languages`, its figures drawn into `folder`/figures beside the report's."""
    figures = draw_figures(report.inputs, folder / "figures", params.report.languages)
    written = []
    for language in params.report.languages:
        catalogue = load_catalogue(language)
        markdown = handin_markdown(report.inputs, report.rows, params, figures, catalogue, report.findings)
        page = markdown_to_html(linked_to_html(markdown), catalogue("title"), folder, HTML_LANGUAGE[language])
        written.append(Handin(language, markdown, page, for_mlflow(markdown, catalogue)))
    return written, figures


def draw_figures(inputs: ReportInputs, figures: Path, languages: Sequence[str]) -> HandinFigures:
    """Each language's figures, written into `figures` (the graph, which has no words, is copied there by the main
    report)."""
    curves = TRAIN_EPOCHS_PLOT.exists() and TRAIN_STEPS_PLOT.exists()
    epochs, steps = (read_csv(TRAIN_EPOCHS_PLOT), read_csv(TRAIN_STEPS_PLOT)) if curves else ([], [])
    for language in languages:
        catalogue = load_catalogue(language)
        if curves:
            curves_figure(epochs, steps, figures / Path(curves_path(language)).name, catalogue)
        if inputs.profiles:
            operators_figure(inputs.profiles, figures / Path(operators_path(language)).name, catalogue)
    views = current_views()
    if isinstance(views, tuple):
        for path in views:
            shutil.copyfile(path, figures / path.name)
    stale = views if isinstance(views, str) else ""
    return HandinFigures(
        GRAPH_SVG.exists(),
        curves,
        bool(inputs.profiles),
        tuple(languages),
        isinstance(views, tuple),
        stale,
        view_runs() if isinstance(views, tuple) else ("", ""),
    )


def handin_markdown(
    inputs: ReportInputs,
    rows: Sequence[ComparisonRow],
    params: Params,
    drawn: HandinFigures,
    catalogue: Catalogue,
    found: Sequence[Finding] = (),
) -> str:
    groups = {record.combination.name: operator_groups(record) for record in inputs.profiles}
    sections = [
        f"# {catalogue('title')}\n",
        f"## {catalogue('environment_heading')}\n",
        environment_table(inputs, catalogue),
        version_note(inputs, catalogue),
        f"## {catalogue('results_heading')}\n",
        f"### {catalogue('visualisation_heading')}\n",
        visualisation_table(inputs, params, drawn, catalogue),
        commands(inputs, catalogue),
        f"### {catalogue('batches_heading')}\n",
        batches_command(params, catalogue),
        batch_table(inputs, rows, params, catalogue),
        modes_table(inputs, rows, params, catalogue),
        batch_notes(inputs, rows, params, catalogue),
        paired_note(inputs, catalogue),
        conditions_note(inputs, params, catalogue),
        f"### {catalogue('gpu_heading')}\n",
        gpu_section(rows, catalogue),
        f"### {catalogue('analysis_heading')}\n",
        handin_analysis(found, inputs, catalogue, groups) if found else catalogue("analysis_none") + "\n",
    ]
    return "\n".join(section for section in sections if section)


def _table(rows: Sequence[Sequence[str]], columns: int) -> str:
    """The template's tables: an empty header row, as the handout draws them, then the labelled rows."""
    lines = ["|" + " |" * columns, "|" + " --- |" * columns]
    lines += ["| " + " | ".join(cell.replace("\n", "<br>") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def environment_table(inputs: ReportInputs, catalogue: Catalogue) -> str:
    hardware = inputs.hardware
    labels = [
        ("hardware", "cpu_label"),
        ("hardware", "gpu_label"),
        ("software", "os_label"),
        ("software", "framework_label"),
        ("software", "cuda_label"),
    ]
    if hardware is None:
        values = [catalogue("missing", stage="validate")] * len(labels)
    else:
        gpus = Counter(gpu_names(hardware))
        runtime = cuda_runtime(inputs.profiles)
        build = hardware.get("torch_cuda_build", catalogue("not_recorded"))
        values = [
            "\n".join(
                [
                    catalogue(
                        "cpu_value",
                        cpu=hardware[CPU_MODEL],
                        family_model=_family_model(hardware.get("cpu_family_model"), catalogue),
                        vcpus=hardware["cpu_count"],
                    ),
                    *_instruction_sets(hardware.get("cpu_features"), catalogue),
                ]
            ),
            "<br>".join(catalogue("gpu_value", model=model, count=count) for model, count in sorted(gpus.items()))
            or catalogue("no_gpu"),
            f"{hardware['os']} ({hardware['machine']})",
            "<br>".join(
                f"{name} {version}"
                for name, version in (
                    ("PyTorch", hardware.get("torch")),
                    ("torchvision", hardware.get("torchvision")),
                    ("TensorBoard", inputs.tensorboard),
                    ("Python", hardware.get("python")),
                )
                if version
            ),
            catalogue("cuda_used", build=build, runtime=runtime) if runtime else catalogue("cuda_unused", build=build),
        ]
    return _table(
        [(catalogue(group), catalogue(label), value) for (group, label), value in zip(labels, values, strict=True)], 3
    )


def version_note(inputs: ReportInputs, catalogue: Catalogue) -> str:
    """Where the PyTorch that ran is not the handout's: which one ran, said once under the environment table."""
    torch = (inputs.hardware or {}).get("torch", "")
    if not torch or torch.startswith(HANDOUT_TORCH):
        return ""
    return catalogue("version_note", handout=HANDOUT_TORCH, torch=torch) + "\n"


def commands(inputs: ReportInputs, catalogue: Catalogue) -> str:
    """Steps 2-5 as commands, and step 5's profiler call as the profile stage makes it."""
    blocks = [catalogue("handin_commands")]
    if inputs.profiles:
        steps = inputs.profiles[0].settings.active_steps
        blocks.append(
            catalogue("handin_profiler_call", steps=steps, attempts=TRACE_ATTEMPTS)
            + f"\n\n```python\n{PROFILER_CALL}```"
        )
    return "\n\n".join(blocks) + "\n"


def _family_model(recorded: str | None, catalogue: Catalogue) -> str:
    """The fingerprint's `family 6, model 207` in the hand-in's words; as recorded where it reads otherwise."""
    found = re.fullmatch(r"family (\d+), model (\d+)", recorded or "")
    if found is None:
        return recorded or catalogue("not_recorded")
    return catalogue("family_model", family=found.group(1), model=found.group(2))


def _instruction_sets(recorded: str | None, catalogue: Catalogue) -> list[str]:
    """The CPU's recorded kernel features as one line of its cell ("AVX2, FMA, AVX-512 (VNNI, BF16)"); no line where
    the fingerprint records none (`none`, `unknown`, or a fingerprint older than the key)."""
    families: dict[str, list[str]] = {}
    for flag in (recorded or "").split():
        if flag in ("none", "unknown"):
            continue
        family, extension = INSTRUCTION_SETS.get(flag, (flag, ""))
        families.setdefault(family, []).extend([extension] if extension else [])
    if not families:
        return []
    joiner = catalogue("list_joiner")
    names = [
        family + (catalogue("cell_aside", aside=joiner.join(extensions)) if extensions else "")
        for family, extensions in families.items()
    ]
    return [catalogue("cpu_features", features=joiner.join(names))]


def visualisation_table(inputs: ReportInputs, params: Params, drawn: HandinFigures, catalogue: Catalogue) -> str:
    graph = catalogue("missing", stage="export_graph")
    if drawn.graph:
        parameters = inputs.graph_metrics.get("total_parameters") if inputs.graph_metrics else None
        caption = f"<br>{catalogue('graph_caption', parameters=f'{parameters:,}')}" if parameters else ""
        graph = f"![{catalogue('graph_label')}]({GRAPH_FIGURE}){caption}"
        if drawn.views:
            graph += f"<br>![{catalogue('view_graph_label')}](figures/{GRAPH_VIEW.name})<br>" + catalogue(
                "view_graph_caption"
            )
    curves = catalogue("missing", stage="train")
    if drawn.curves and inputs.train_metrics:
        metrics = inputs.train_metrics
        caption = catalogue(
            "curves_caption",
            accuracy=metrics["test_accuracy"],
            loss=metrics["test_loss"],
            epochs=catalogue.counted(int(metrics.get("epochs", params.train.epochs)), "count_epoch", "count_epochs"),
            batch=params.train.batch_size,
            lr=params.train.lr,
            gamma=params.train.gamma,
            seed=params.train.seed,
        )
        layout = catalogue("sentence_joiner") + catalogue("curves_layout", steps=params.train.log_every_steps)
        curves = f"![{catalogue('curves_label')}]({curves_path(catalogue.language)})<br>{caption}{layout}"
        if drawn.views:
            curves += f"<br>![{catalogue('view_scalars_label')}](figures/{SCALARS_VIEW.name})<br>" + catalogue(
                "view_scalars_caption"
            )
    operators = catalogue("missing", stage=" ".join(f"profile@{device}" for device in params.profile.devices))
    if drawn.operators:
        batches = sorted({r.combination.batch_size for r in inputs.profiles})
        columns = sorted({(r.combination.device, r.combination.mode) for r in inputs.profiles})
        lines = [
            f"![{catalogue('operators_label')}]({operators_path(catalogue.language)})",
            catalogue("operators_caption", top_k=max(len(r.top_operators) for r in inputs.profiles))
            + catalogue("sentence_joiner")
            + catalogue(
                "operators_layout",
                batches=catalogue("list_joiner").join(str(b) for b in batches),
                columns=catalogue("list_joiner").join(
                    catalogue("fig_column", device=catalogue(f"device_{d}"), mode=catalogue(f"mode_{m}"))
                    for d, m in columns
                ),
            ),
        ]
        for record in inputs.profiles:
            if record.top_operators:
                top = record.top_operators
                if record.top_operator_ranked:
                    line = catalogue(
                        "top_operator_line",
                        combination=combination_words(record.combination, catalogue),
                        operator=top[0].operator,
                        share=top[0].share_pct,
                    )
                else:  # the profiler's hooks could swap the first two
                    line = catalogue(
                        "top_operators_unranked_line",
                        combination=combination_words(record.combination, catalogue),
                        operator=top[0].operator,
                        share=top[0].share_pct,
                        second=top[1].operator,
                        second_share=top[1].share_pct,
                    )
                lines.append(line)
            check = record.trace_check
            if check is not None and not check.inside:
                lines.append(
                    catalogue(
                        "table_not_timed" if check.untraced_step_ms is None else "table_process_not_timed",
                        combination=combination_words(record.combination, catalogue),
                        traced=check.checked_ms,
                        low=check.bounds_ms[0],
                        high=check.bounds_ms[1],
                    )
                )
        operators = "<br>".join(lines)
    return (
        _table(
            [
                (catalogue("graph_label"), graph),
                (catalogue("curves_label"), curves),
                (catalogue("operators_label"), operators),
            ],
            2,
        )
        + "\n"
        + (
            catalogue("tensorboard_line", train=drawn.view_runs[0], export=drawn.view_runs[1])
            if drawn.views
            else catalogue("views_stale", path=drawn.views_stale)
            if drawn.views_stale
            else catalogue("views_missing")
        )
        + "\n"
    )


def combination_words(combination: Combination, catalogue: Catalogue) -> str:
    """`16-cpu-train` in the hand-in's words: "batch 16, CPU training" / "批大小 16，CPU 训练"."""
    return catalogue(
        "combination",
        batch=combination.batch_size,
        device=catalogue(f"device_{combination.device}"),
        mode=catalogue(f"mode_{combination.mode}"),
    )


def batches_command(params: Params, catalogue: Catalogue) -> str:
    """Step 6's batch sizes (`profile.batch_sizes`), and the command that profiles another set: the same with twice
    the largest added."""
    sizes = params.profile.batch_sizes
    batches = ",".join(str(batch) for batch in sizes)
    extra = 2 * max(sizes)
    other = ",".join(str(batch) for batch in sorted({*sizes, extra}))
    return catalogue("handin_batches_command", batches=batches, extra=extra, other=other) + "\n"


def batch_table(inputs: ReportInputs, rows: Sequence[ComparisonRow], params: Params, catalogue: Catalogue) -> str:
    """One row per profiled batch size (`profile.batch_sizes`) x device x mode, in the template's order (batch sizes
    first): the timed step (median, 95 % interval), per sample, throughput, peak memory (and energy where measured),
    and the per-sample paired ratio to the next smaller profiled batch, with a direction only where it is
    measurable. A batch size with no profile gets one row naming the command that fills it."""
    by_name = {row.combination.name: row for row in rows}
    by_device = {found.device: found for found in inputs.comparisons}
    profiled = sorted(params.profile.batch_sizes)
    memory = any(row.peak_memory_mb is not None for row in rows)
    energy = any(row.energy_mj_per_sample is not None for row in rows)
    keys = ["col_batch", "col_combination", "col_step", "col_per_sample", "col_throughput"]
    keys += ["col_memory"] * memory + ["col_energy"] * energy + ["col_ratio"]
    lines = ["| " + " | ".join(catalogue(key) for key in keys) + " |"]
    lines.append("| " + " | ".join("---:" if key != "col_combination" else "---" for key in keys) + " |")
    for batch in profiled:
        smaller = [size for size in profiled if size < batch]
        found_any = False
        for device in params.profile.devices:
            for mode in params.profile.modes:
                row = by_name.get(f"{batch}-{device}-{mode}")
                if row is None:
                    continue
                found_any = True
                cells = [
                    str(batch),
                    catalogue("fig_column", device=catalogue(f"device_{device}"), mode=catalogue(f"mode_{mode}")),
                    catalogue(
                        "step_cell", step=row.step_time_ms, low=row.step_time_ms_ci_low, high=row.step_time_ms_ci_high
                    ),
                    f"{row.per_sample_ms:.4f}",
                    f"{row.throughput_samples_per_s:.0f}",
                ]
                if memory:
                    cells.append(f"{row.peak_memory_mb:.1f}" if row.peak_memory_mb is not None else "–")
                if energy:
                    found_energy = row.energy_mj_per_sample
                    cells.append(
                        catalogue(
                            "energy_cell", energy=found_energy.value, low=found_energy.low, high=found_energy.high
                        )
                        if found_energy is not None
                        else "–"
                    )
                cells.append(
                    _ratio_cell(by_device.get(device), row.combination, smaller[-1], catalogue) if smaller else "–"
                )
                lines.append("| " + " | ".join(cells) + " |")
        if not found_any:
            missing = catalogue("missing", stage=" ".join(f"profile@{device}" for device in params.profile.devices))
            lines.append("| " + " | ".join([str(batch), missing] + ["–"] * (len(keys) - 2)) + " |")
    return "\n".join(lines) + "\n"


def _processes(found: PairedComparison, catalogue: Catalogue) -> str:
    """Where the timing processes did not all put the ratio on one side of 1, how many did (said beside a decided
    direction, which a split weakens); nothing where they all agree."""
    values = found.process_values
    if not values or all(value < 1 for value in values) or all(value > 1 for value in values):
        return ""
    return catalogue("processes_split", above=sum(value > 1 for value in values), count=len(values))


def _paired(comparisons: DeviceComparisons | None, combination: Combination, previous: int) -> PairedComparison | None:
    smaller = dataclasses.replace(combination, batch_size=previous)
    return comparisons.by_pair.get((combination.name, smaller.name)) if comparisons else None


def _ratio_cell(
    comparisons: DeviceComparisons | None, combination: Combination, previous: int, catalogue: Catalogue
) -> str:
    """Per-sample time against the next smaller batch: its paired ratio, with a direction only where it is
    measurable (what would decide an undecided one is said under the table)."""
    found = _paired(comparisons, combination, previous)
    if found is None:
        return "–"
    values = {"ratio": found.value, "low": found.low, "high": found.high}
    key = "ratio_lower" if found.high < 1 else "ratio_higher" if found.low > 1 else "ratio_same"
    cell = catalogue(key, **values)
    split = _processes(found, catalogue) if key != "ratio_same" else ""
    return cell + (catalogue("cell_aside", aside=split) if split else "")


def modes_table(inputs: ReportInputs, rows: Sequence[ComparisonRow], params: Params, catalogue: Catalogue) -> str:
    """Training step over inference step at each batch size and device: the paired ratio (a direction only where its
    interval excludes 1) beside what the FLOP count predicts."""
    by_name = {row.combination.name: row for row in rows}
    records = {record.combination.name: record for record in inputs.profiles}
    lines = []
    for batch in sorted(params.profile.batch_sizes):
        for found in inputs.comparisons:
            device = found.device
            train, inference = f"{batch}-{device}-train", f"{batch}-{device}-inference"
            paired = found.by_pair.get((train, inference))
            if paired is None or train not in by_name or inference not in by_name:
                continue
            values = {"ratio": paired.value, "low": paired.low, "high": paired.high}
            cell = catalogue("mode_cell" if paired.low > 1 or paired.high < 1 else "mode_cell_same", **values)
            split = _processes(paired, catalogue)
            flops = "–"
            if train in records and inference in records:
                train_flops = records[train].analysis.flop_rate.flops_per_step
                inference_flops = records[inference].analysis.flop_rate.flops_per_step
                if train_flops > 0 and inference_flops > 0:
                    flops = catalogue("flop_ratio_cell", ratio=train_flops / inference_flops)
            aside = catalogue("cell_aside", aside=split) if split else ""
            lines.append(f"| {batch} | {catalogue(f'device_{device}')} | {cell}{aside} | {flops} |")
    if not lines:
        return ""
    header = [catalogue(key) for key in ("col_batch", "col_device", "col_modes", "col_flop_ratio")]
    return "\n".join(["| " + " | ".join(header) + " |", "| ---: | --- | ---: | ---: |", *lines]) + "\n"


def batch_notes(inputs: ReportInputs, rows: Sequence[ComparisonRow], params: Params, catalogue: Catalogue) -> str:
    """Under the tables, each said once: what peak memory is, what would decide each undecided ratio, the rows
    flagged where their uncertainty could change a conclusion, and the template's rows not profiled."""
    by_device = {found.device: found for found in inputs.comparisons}
    profiled = sorted(params.profile.batch_sizes)
    notes = []
    if any(row.peak_memory_mb is not None for row in rows):
        notes.append(catalogue("memory_note"))
    for row in sorted(rows, key=lambda r: (r.batch_size, r.device, r.mode)):
        words = combination_words(row.combination, catalogue)
        smaller = [size for size in profiled if size < row.batch_size]
        if smaller:
            undecided = _undecided(by_device.get(row.device), row.combination, smaller[-1], catalogue)
            if undecided:
                notes.append(catalogue("row_note", combination=words, note=undecided))
        notes += [catalogue("row_note", combination=words, note=flag) for flag in _flags(row, catalogue)]
    unprofiled = [batch for batch in TEMPLATE_BATCHES if batch not in profiled]
    if unprofiled:
        notes.append(catalogue("template_not_profiled", batches=catalogue("list_joiner").join(map(str, unprofiled))))
    return "\n\n".join(notes) + "\n" if notes else ""


def _undecided(
    comparisons: DeviceComparisons | None, combination: Combination, previous: int, catalogue: Catalogue
) -> str:
    """What would decide a per-sample ratio whose interval holds 1 (or that was not paired); "" where decided."""
    found = _paired(comparisons, combination, previous)
    if found is None:
        return catalogue("per_sample_unpaired", previous=previous, device=combination.device)
    if found.high < 1 or found.low > 1:
        return ""
    values = {"ratio": found.value, "low": found.low, "high": found.high, "previous": previous}
    processes = len(found.process_values)
    needed = processes_to_decide(found, processes)
    if needed is None or needed > MOST_PROCESSES_ADVISED:
        return catalogue("per_sample_same", most=MOST_PROCESSES_ADVISED, **values)
    return catalogue("per_sample_same_more", needed=needed, processes=processes, **values)


def _flags(row: ComparisonRow, catalogue: Catalogue) -> list[str]:
    """Flags on what could change a conclusion drawn from this row: too few processes for an interval, a busy machine,
    an operator table from another step. A wide interval alone changes none: every direction is read from a paired
    ratio, whose cell says where the data cannot decide it and the note under the table what would."""
    flags = []
    if row.too_few_processes:
        flags.append(
            catalogue(
                "flag_too_few",
                processes=catalogue.counted(row.processes, "count_process", "count_processes"),
                target=row.ci_target_pct,
                minimum=MIN_ORDER_STATISTIC_PROCESSES,
            )
        )
    if row.machine_busy:
        flags.append(catalogue("flag_busy"))
    if not row.trace_inside:
        flags.append(catalogue("flag_not_timed"))
    return flags


def paired_note(inputs: ReportInputs, catalogue: Catalogue) -> str:
    """How the tables' numbers were timed: interleaved in fresh processes (and, where they ran side by side, how
    many at once), what the intervals are, and what a rerun can move."""
    if not inputs.comparisons:
        return ""
    processes = max(found.processes for found in inputs.comparisons)
    if not inputs.drift:
        return catalogue("paired_note_no_drift", processes=processes) + _side_by_side(inputs, catalogue) + "\n"
    drift = catalogue("list_joiner").join(
        catalogue("drift_item", value=rounded_up(probe.half_width_pct, 1), device=catalogue(f"device_{device}"))
        for device, probe in sorted(inputs.drift.items())
    )
    spans = catalogue("list_joiner").join(f"{span:g}" for span in probe_spans(inputs.drift))
    note = catalogue("paired_note", drift=drift, seconds=spans, processes=processes)
    wider = wider_than_the_probe(inputs.drift, inputs.comparisons)
    if wider:
        devices = catalogue("list_joiner").join(catalogue(f"device_{found.device}") for found in wider)
        note += catalogue("paired_note_wider", devices=devices)
    return note + _side_by_side(inputs, catalogue) + "\n"


def _side_by_side(inputs: ReportInputs, catalogue: Catalogue) -> str:
    """Each device whose timing processes ran more than one at a time (`profile.processes_at_once`): how many at once
    and with how many threads each; no core is named, as no process is pinned to one; "" for none."""
    ran = {
        record.combination.device: (record.settings.processes_at_once, record.settings.threads)
        for record in inputs.profiles
    }
    return "".join(
        catalogue("sentence_joiner")
        + catalogue(
            "paired_note_at_once",
            device=catalogue(f"device_{device}"),
            at_once=at_once,
            threads=catalogue.counted(threads, "count_thread", "count_threads"),
        )
        for device, (at_once, threads) in ran.items()
        if at_once > 1
    )


def conditions_note(inputs: ReportInputs, params: Params, catalogue: Catalogue) -> str:
    """The traced pass named (the analysis reads its layers from it), and the conditions of both measurements, each
    with the reason the project gives for it (one thread: docs/timing.md; fp32: pipeline.records.profile's
    PROFILE_PRECISION; training's defaults: params.yaml's `train` comments). "" without a profile."""
    if not inputs.profiles:
        return ""
    settings = inputs.profiles[0].settings
    sentences = [
        catalogue(
            "handin_conditions",
            threads=catalogue.counted(settings.threads, "count_thread", "count_threads"),
            precision=settings.precision,
        )
    ]
    if settings.threads == 1:
        sentences.append(catalogue("handin_conditions_one_thread"))
    if settings.precision == PROFILE_PRECISION:
        sentences.append(catalogue("handin_conditions_fp32"))
    ran = inputs.train_speed.get("runtime", {}) if inputs.train_speed else {}
    if ran:
        threads, precision = ran.get("threads", params.train.threads), ran.get("precision", params.train.precision)
        defaults = (params.train.threads, params.train.precision) == (0, "auto")
        key = "handin_conditions_train_auto" if defaults else "handin_conditions_train"
        sentences.append(
            catalogue(
                key, threads=catalogue.counted(int(threads), "count_thread", "count_threads"), precision=precision
            )
        )
    return catalogue("sentence_joiner").join(sentences) + "\n"


def gpu_section(rows: Sequence[ComparisonRow], catalogue: Catalogue) -> str:
    """Per-sample time on the CPU and the GPU at each batch size and mode, and the GPU's speed-up (not paired:
    the devices are timed in separate stages); or how to add a GPU."""
    pairs = host_and_gpu_pairs(rows)
    if not pairs:
        return catalogue("gpu_missing") + "\n"
    header = [catalogue(key) for key in ("gpu_batch", "gpu_mode", "gpu_cpu_ms", "gpu_gpu_ms", "gpu_speedup")]
    lines = ["| " + " | ".join(header) + " |", "| ---: | --- | ---: | ---: | --- |"]
    for cpu, gpu in sorted(pairs, key=lambda pair: (pair[0].mode, pair[0].batch_size)):
        speedup = cpu.per_sample_interval / gpu.per_sample_interval
        values = {"ratio": speedup.value, "low": speedup.low, "high": speedup.high}
        cell = catalogue("speedup", **values) if speedup.measurable else catalogue("speedup_none", **values)
        mode = catalogue(f"mode_{cpu.mode}")
        lines.append(f"| {cpu.batch_size} | {mode} | {cpu.per_sample_ms:.4f} | {gpu.per_sample_ms:.4f} | {cell} |")
    return "\n".join(lines) + "\n\n" + catalogue("gpu_note") + "\n"
