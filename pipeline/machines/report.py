"""Compare machines: one report across every machine whose profile runs share a tracking store.

    python -m pipeline.machines [--output machines] [--experiment NAME] [--baseline MACHINE]

A workspace only ever holds one machine's `profiles/`; a shared MLflow server holds everyone's profile
runs with their `hardware.*` and `machine.*` tags. This reads those runs and writes
`<output>/machines.md`, a self-contained `machines.html`, `machines.csv` and the figures.

Not a DVC stage: its input is the tracking store, state outside the workspace that other machines
change at any time and that DVC cannot hash. As a stage it would be either stale (cached) or rerun on
every `dvc repro`, and its output would differ between clones of the same commit.

What is compared with what (never mixed silently):
- a *group* is one checkpoint (`model.digest` tag: SHA-256 of models/model.pt) profiled with one set
  of profile settings and one kind of step-time estimate. The settings are every run param except the
  combination, the machine's `hardware.*` facts, its thread count, and the params that only say how
  long to warm up, to measure or to trace (`profile.warmup_steps`, `profile.ci_target_pct`,
  `profile.time_budget_s`, `profile.active_steps`, `profile.top_k`): a machine that raises its time
  budget to beat noise, as the profile stage advises, still compares. Groups are reported apart, and the
  report names what separates them;
- in a group, the latest FINISHED run per machine and combination (batch size, device, mode) counts;
- runs without a model digest (logged before the tag existed) or without the params of a profile
  run are left out and counted, with the reason.

Step time: the median with its 95 % confidence interval (metrics `step_time_ms_median`,
`step_time_ms_ci_low`/`_high`, pipeline.records.statistics), or for runs timed before those existed
the mean of the timed steps and their coefficient of variation (`step_time_ms_mean`, `step_time_cv`:
a spread, not an uncertainty). The two never share a group.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import matplotlib.pyplot as plt

from pipeline.common.errors import PipelineError
from pipeline.common.machine import CPU_MODEL
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.tables import NO_NUMBER, rows_csv
from pipeline.machines.compare import (
    Group,
    GroupKey,
    MachineRow,
    Speedup,
    choose_baseline,
    display_names,
    group_runs,
    machine_row,
    names_machine,
    speedups,
)
from pipeline.machines.runs import STATISTICS, LeftOut, ProfileRun
from pipeline.report.figures import DPI
from pipeline.report.rendering import markdown_to_html
from pipeline.tracking.tags import MODEL_DIGEST_TAG

TITLE = "MNIST lab: machines compared"
MARKDOWN_FILE = "machines.md"
HTML_FILE = "machines.html"
CSV_FILE = "machines.csv"
FIGURES = "figures"


# --- markdown ------------------------------------------------------------------------------------


def _significant(value: float, digits: int = 4) -> str:
    """4 significant digits, thousands as `23,136`: ms from 0.003 to 50, throughput from 100 to 300,000."""
    return f"{value:.{digits}g}" if value < 1000 else f"{value:,.0f}"


def _with_interval(value: float, low: float | None, high: float | None, digits: int = 4) -> str:
    if low is None or high is None:
        return _significant(value, digits)
    if low <= 0:  # too few timed blocks for any interval: the run recorded [0, 2 x median]
        return f"{_significant(value, digits)} (unbounded)"
    return f"{_significant(value, digits)} ({_significant(low, digits)}-{_significant(high, digits)})"


def rows_markdown(rows: Sequence[MachineRow]) -> str:
    # Memory and energy columns only where some run measured them (runs from before carry neither).
    columns: tuple[tuple[str, Callable[[MachineRow], float | None]], ...] = (
        ("peak MB", lambda row: row.peak_memory_mb),
        ("mJ/sample", lambda row: row.energy_mj_per_sample),
    )
    extra = [(title, value) for title, value in columns if any(value(row) is not None for row in rows)]
    lines = [
        "| machine | device | mode | batch | estimate | step ms | per-sample ms | samples/s | "
        + "".join(f"{title} | " for title, _ in extra)
        + "run |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | " + "---: | " * len(extra) + "--- |",
    ]
    for row in rows:
        if row.statistic == "median":
            estimate = "median, 95 % CI" + (" ⚠ noisy" if row.noisy else "") + (" ⚠ busy" if row.busy else "")
            step = _with_interval(row.step_time_ms, row.step_time_ms_ci_low, row.step_time_ms_ci_high)
            low, high = row.step_time_ms_ci_low, row.step_time_ms_ci_high
            throughput = _with_interval(
                row.throughput_samples_per_s,
                1000.0 * row.batch_size / high if high and low else None,
                1000.0 * row.batch_size / low if high and low else None,
            )
        else:
            estimate = "mean, CV of steps"
            cv = f" (CV {row.step_time_cv:.1%})" if row.step_time_cv is not None else ""
            step = f"{_significant(row.step_time_ms)}{cv}"
            throughput = _significant(row.throughput_samples_per_s)
        per_sample = _with_interval(row.per_sample_ms, row.per_sample_ms_ci_low, row.per_sample_ms_ci_high)
        cells = "".join(f"{NO_NUMBER if (v := value(row)) is None else _significant(v)} | " for _, value in extra)
        lines.append(
            f"| {row.machine} | {row.device} | {row.mode} | {row.batch_size} | {estimate} | {step} | {per_sample} | "
            f"{throughput} | {cells}`{row.run_id[:8]}` |"
        )
    notes = []
    if any(row.noisy for row in rows):
        notes.append(
            "⚠ noisy: the 95 % interval missed the run's target width; rerun on a quiet machine or raise "
            "`profile.time_budget_s`."
        )
    if any(row.busy for row in rows):
        notes.append(
            "⚠ busy: the load average exceeded the cores while timing: the times are inflated and the "
            "interval too narrow (it assumes steady conditions), so ratios with such a row overstate "
            "what the data show; rerun on a quiet machine."
        )
    return "\n".join(lines) + "\n" + "".join(f"\n{note}\n" for note in notes)


def speedups_markdown(ratios: Sequence[Speedup], baseline: tuple[str, str]) -> str:
    platforms = sorted({(ratio.machine, ratio.device) for ratio in ratios})
    cells = {(r.mode, r.batch_size, r.machine, r.device): r.with_interval() for r in ratios}
    header = " | ".join(f"{machine} · {device}" for machine, device in platforms)
    lines = [
        f"Per-sample speed-up over **{baseline[0]} · {baseline[1]}** (its time ÷ the other's: 2x = twice as fast):\n",
        f"| mode | batch | {header} |",
        "| --- | ---: |" + " ---: |" * len(platforms),
    ]
    for mode, batch in sorted({(r.mode, r.batch_size) for r in ratios}):
        row = " | ".join(cells.get((mode, batch, *platform), "-") for platform in platforms)
        lines.append(f"| {mode} | {batch} | {row} |")
    note = ""
    if any(speed.interval is None for speed in ratios):
        note = (
            "\n† no confidence interval: ratio of two means of steps (runs timed before the timing statistics); "
            "a ratio near 1, or between runs whose steps have a large CV, is no evidence of a difference.\n"
        )
    return "\n".join(lines) + "\n" + note


def environment_markdown(runs: Sequence[ProfileRun], names: Mapping[str, str]) -> str:
    """One row per machine: what it is and what it ran (from the `hardware.*` tags of its runs)."""
    by_machine: dict[str, list[ProfileRun]] = defaultdict(list)
    for run in runs:
        by_machine[run.machine.id].append(run)
    lines = [
        "| machine | id | CPU | vCPUs | GPUs | OS | Python | PyTorch | torchvision | CUDA build | CUDA runtime "
        "| threads | runs | latest run |",
        "| --- | --- | --- | ---: | --- | --- | --- | --- | --- | --- | --- | --- | ---: | --- |",
    ]
    for machine_key in sorted(by_machine, key=lambda key: names[key]):
        members = by_machine[machine_key]
        newest = max(members, key=lambda run: run.started_ms)
        env = newest.environment
        cuda = sorted({run.environment.get("cuda_runtime", "") for run in members} - {""})
        threads = sorted({run.threads for run in members}, key=lambda value: (len(value), value))
        latest = time.strftime("%Y-%m-%d %H:%M", time.gmtime(newest.started_ms / 1000))
        lines.append(
            f"| {names[machine_key]} | `{machine_key}` | {env.get(CPU_MODEL, '?')} | {env.get('cpu_count', '?')} | "
            f"{env.get('gpus', '?')} | {env.get('os', '?')} ({env.get('machine', '?')}) | {env.get('python', '?')} | "
            f"{env.get('torch', '?')} | {env.get('torchvision', '?')} | {env.get('torch_cuda_build', '?')} | "
            f"{', '.join(cuda) or 'not used'} | {', '.join(threads)} | {len(members)} | {latest} UTC |"
        )
    return "\n".join(lines) + "\n"


def settings_text(key: GroupKey) -> str:
    settings = ", ".join(f"`{name}` {value}" for name, value in key.settings) or "none recorded"
    return f"model `{key.model_digest[:12]}`; step time: {STATISTICS[key.statistic]}; settings: {settings}"


def differences(key: GroupKey, reference: GroupKey) -> str:
    """What separates `key` from `reference`, in words."""
    parts = []
    if key.model_digest != reference.model_digest:
        parts.append(f"another checkpoint (`model.digest` {key.model_digest[:12]} vs {reference.model_digest[:12]})")
    if key.statistic != reference.statistic:
        parts.append(f"step time: {STATISTICS[key.statistic]} vs {STATISTICS[reference.statistic]}")
    mine, theirs = dict(key.settings), dict(reference.settings)
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            parts.append(f"`{name}` {mine.get(name, 'not set')} vs {theirs.get(name, 'not set')}")
    return "; ".join(parts)


@dataclass(frozen=True)
class MachinesReport:
    markdown: str
    rows: list[MachineRow]
    speedups: list[Speedup]
    figures: list[str]  # file names under figures/


def build_machines_report(
    runs: Sequence[ProfileRun],
    left_out: Sequence[LeftOut],
    source: str,
    figures: Path,
    this_machine: str | None = None,
    baseline: str | None = None,
) -> MachinesReport:
    """Group, select and compare `runs`; write the figures into `figures` and return the report."""
    if not runs:
        reasons = Counter(item.reason for item in left_out)
        detail = "; ".join(f"{count} with {reason}" for reason, count in reasons.most_common()) or "none found"
        raise PipelineError(
            f"No usable profile run in {source} ({detail}). Run the profile stages (`dvc repro`) on each machine "
            "with $MLFLOW_TRACKING_URI pointing at the shared server (README: 'Comparing machines')."
        )
    groups, superseded = group_runs(runs)
    names = display_names(run.machine for group in groups for run in group.runs)
    if baseline and not any(names_machine(baseline, names[m.id], m.id) for g in groups for m in g.machines):
        known = ", ".join(sorted(set(names.values())))
        raise PipelineError(f"--baseline {baseline!r} matches no machine in {source}; the machines are: {known}.")
    latest = [run for group in groups for run in group.runs]
    sections = [
        f"# {TITLE}\n",
        f"Built by `python -m pipeline.machines` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from "
        f"{source}: the latest FINISHED `profile` run of each machine and combination, {len(latest)} runs "
        f"({superseded} older ones superseded). Runs are grouped by checkpoint (`model.digest`) and profile "
        "settings; groups are never merged.\n",
        "## Machines\n",
        environment_markdown(latest, names),
    ]
    if len(groups) > 1:
        sections.append(_not_comparable_markdown(groups))
    rows: list[MachineRow] = []
    ratios: list[Speedup] = []
    written: list[str] = []
    for index, group in enumerate(groups, start=1):
        group_rows = [machine_row(index, run, names) for run in group.runs]
        rows += group_rows
        machine_list = ", ".join(names[machine.id] for machine in group.machines)
        sections.append(f"## Group {index}: {len(group.machines)} machine(s)\n")
        sections.append(f"{settings_text(group.key)}. Machines: {machine_list}.\n")
        sections.append(rows_markdown(group_rows))
        for stem, value in (("per_sample_time", "per_sample"), ("throughput", "throughput")):
            name = f"group-{index}-{stem}.png"
            batch_size_figure(group_rows, value, figures / name)  # type: ignore[arg-type]
            written.append(name)
            sections.append(f"![{stem.replace('_', ' ')}, group {index}]({FIGURES}/{name})\n")
        if len(group.machines) > 1 or len({row.device for row in group_rows}) > 1:
            chosen = choose_baseline(group_rows, baseline, this_machine)
            group_ratios = speedups(index, group_rows, chosen)
            ratios += group_ratios
            sections.append(f"### Group {index}: ratios\n")
            sections.append(
                speedups_markdown(group_ratios, chosen) if group_ratios else "_No combination in common._\n"
            )
        else:
            sections.append("_One machine and device only: nothing to compare it with in this group._\n")
    if left_out:
        sections.append(_left_out_markdown(left_out))
    return MachinesReport("\n".join(sections), rows, ratios, written)


def _not_comparable_markdown(groups: Sequence[Group]) -> str:
    """Why the groups after the first are reported apart: what differs from group 1."""
    listing = "".join(
        f"- group {index}: {len(group.machines)} machine(s), {len(group.runs)} runs; differs from group 1 in "
        f"{differences(group.key, groups[0].key)}.\n"
        for index, group in enumerate(groups[1:], start=2)
    )
    return (
        "## Not comparable\n\n"
        f"The runs form {len(groups)} groups that are reported apart, because they measure different things:\n\n"
        f"{listing}\n"
        "\nA machine that trained its own checkpoint has its own `model.digest` (training is bit-identical "
        "only on the same CPU): to compare machines, profile one shared checkpoint (`dvc pull`, README: "
        "'Comparing machines').\n"
    )


def _left_out_markdown(left_out: Sequence[LeftOut]) -> str:
    reasons = Counter(item.reason for item in left_out)
    text = "## Runs left out\n\n" + "".join(f"- {count} run(s): {reason}.\n" for reason, count in reasons.most_common())
    if any(MODEL_DIGEST_TAG in item.reason for item in left_out):
        text += (
            "\n\nRuns without a model digest cannot be matched to a checkpoint; rerun the profile stages on that "
            "machine (`dvc repro -f -s profile`) to log runs that carry it.\n"
        )
    return text


# --- figures -------------------------------------------------------------------------------------


def batch_size_figure(rows: Sequence[MachineRow], value: Literal["per_sample", "throughput"], target: Path) -> None:
    """Per-sample time or throughput vs batch size: one panel per mode, one line per machine x device,
    with the 95 % interval as error bars where the runs have one (log-log: costs scale multiplicatively)."""
    label = "per-sample time (ms)" if value == "per_sample" else "throughput (samples/s)"
    modes = sorted({row.mode for row in rows})
    platforms = sorted({row.platform for row in rows})
    colours = {platform: f"C{index % 10}" for index, platform in enumerate(platforms)}
    figure, panels = plt.subplots(1, len(modes), figsize=(5.4 * len(modes), 4.6), squeeze=False, layout="constrained")
    for axes, mode in zip(panels[0], modes, strict=True):
        for platform in platforms:
            points = sorted((r for r in rows if r.mode == mode and r.platform == platform), key=lambda r: r.batch_size)
            if not points:
                continue
            centre, low, high = zip(*(_plotted(point, value) for point in points), strict=True)
            below = [c - lo for c, lo in zip(centre, low, strict=True)]
            above = [h - c for c, h in zip(centre, high, strict=True)]
            axes.errorbar(
                [point.batch_size for point in points],
                centre,
                yerr=[below, above],
                fmt="o-",
                capsize=3,
                color=colours[platform],
                label=f"{platform[0]} · {platform[1]}",
            )
        batch_sizes = sorted({row.batch_size for row in rows if row.mode == mode})
        axes.set(xscale="log", yscale="log", xlabel="batch size", ylabel=label, title=mode)
        axes.set_xticks(batch_sizes, [str(size) for size in batch_sizes])
        axes.grid(alpha=0.3, which="both")
    handles: dict[str, Any] = {}
    for axes in panels[0]:
        for handle, name in zip(*axes.get_legend_handles_labels(), strict=True):
            handles.setdefault(name, handle)
    figure.legend(list(handles.values()), list(handles), loc="outside lower center", fontsize=7, ncols=2)
    figure.savefig(target, dpi=DPI)
    plt.close(figure)


def _plotted(row: MachineRow, value: Literal["per_sample", "throughput"]) -> tuple[float, float, float]:
    """(value, interval low, interval high); without a bounded interval both ends are the value (no error bar)."""
    low, high = row.per_sample_ms_ci_low, row.per_sample_ms_ci_high
    if not low or not high or not math.isfinite(high):  # an end at 0: too few blocks; log axes cannot show it
        low = high = None
    if value == "per_sample":
        return row.per_sample_ms, low or row.per_sample_ms, high or row.per_sample_ms
    centre = row.throughput_samples_per_s  # samples/s = 1000 / per-sample ms: the interval's ends swap
    return centre, 1000.0 / high if high else centre, 1000.0 / low if low else centre


def write_report(report: MachinesReport, scratch: Path, output: Path) -> None:
    """Markdown, self-contained HTML, CSV and figures into `output`, all renamed into place at the end;
    figures of an earlier report that this one no longer has are removed."""
    html = markdown_to_html(report.markdown, TITLE, scratch)
    with AtomicOutputs() as outputs:
        outputs.write_text(output / MARKDOWN_FILE, report.markdown)
        outputs.write_text(output / HTML_FILE, html)
        fields = [field.name for field in dataclasses.fields(MachineRow)]
        outputs.write_text(output / CSV_FILE, rows_csv(fields, map(dataclasses.asdict, report.rows)))
        for name in report.figures:
            outputs.staged(output / FIGURES / name).write_bytes((scratch / FIGURES / name).read_bytes())
    for stale in (output / FIGURES).glob("group-*.png"):
        if stale.name not in report.figures:
            stale.unlink()
