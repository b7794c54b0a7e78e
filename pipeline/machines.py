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
  long to measure or how much to trace (`profile.ci_target_pct`, `profile.time_budget_s`,
  `profile.active_steps`, `profile.top_k`): a machine that raises its time budget to beat noise, as
  the profile stage advises, still compares. Groups are reported apart, and the report names what
  separates them;
- in a group, the latest FINISHED run per machine and combination (batch size, device, mode) counts;
- runs without a model digest (logged before the tag existed) or without the params of a profile
  run are left out and counted, with the reason.

Step time: the median with its 95 % confidence interval (metrics `step_time_ms_median`,
`step_time_ms_ci_low`/`_high`, pipeline.timing_statistics), or for runs timed before those existed
the mean of the timed steps and their coefficient of variation (`step_time_ms_mean`, `step_time_cv`:
a spread, not an uncertainty). The two never share a group.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline.atomic import AtomicOutputs
from pipeline.cli import run_stage
from pipeline.errors import PipelineError
from pipeline.machine_identity import ID_TAG, NAME_TAG, machine_id, machine_name, machine_tags
from pipeline.profile_record import METRIC_PREFIX, Combination
from pipeline.tables import rows_csv
from pipeline.timing_statistics import Interval, Ratio, ratio
from pipeline.tracking import check_tracking_server, tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

TITLE = "MNIST lab: machines compared"
DEFAULT_OUTPUT = Path("machines")
MARKDOWN_FILE = "machines.md"
HTML_FILE = "machines.html"
CSV_FILE = "machines.csv"
FIGURES = "figures"
PROFILE_STAGE = "profile"
MODEL_DIGEST_TAG = "model.digest"
COMBINATION_PARAMS = ("batch_size", "device", "mode")
HARDWARE_PREFIX = "hardware."
# Run params that do not change what is measured: the machine's own thread count (0 = one per core
# gives 2 on a laptop, 16 on a server), how long the timing may run and how tight it aims (they set the
# width of the interval, which the report shows), and how many steps are traced for the operator table.
NOT_SETTINGS = frozenset(
    {
        "threads",
        "profile.threads",
        "profile.top_k",
        "profile.active_steps",
        "profile.ci_target_pct",
        "profile.time_budget_s",
    }
)
STATISTICS = {"median": "median of timed blocks with its 95 % CI", "mean": "mean of timed steps (older runs)"}
# Metric names of the timing statistics (issue 12), with the mean/CV of the simple timing as fallback.
MEDIAN_METRIC, CI_LOW_METRIC, CI_HIGH_METRIC, NOISY_METRIC = (
    "step_time_ms_median",
    "step_time_ms_ci_low",
    "step_time_ms_ci_high",
    "noisy",
)
MEAN_METRIC, CV_METRIC = "step_time_ms_mean", "step_time_cv"
BUSY_METRIC = "machine_busy"  # the load average exceeded the cores while timing (pipeline.timing_statistics)
SEARCH_PAGE = 1000
_FIGURE_DPI = 110


@dataclass(frozen=True)
class Machine:
    id: str
    name: str


@dataclass(frozen=True)
class StepTime:
    """One run's step-time estimate in ms; `low`/`high` bound a 95 % confidence interval where logged."""

    value: float
    statistic: Literal["median", "mean"]
    low: float | None = None
    high: float | None = None
    cv: float | None = None  # stdev / mean of the timed steps (mean estimates only)
    noisy: bool = False  # the run's own verdict: its interval missed the target width
    busy: bool = False  # the machine was busier than its cores while timing: times inflated, interval too narrow

    @property
    def interval(self) -> Interval | None:
        """The 95 % interval (an end at 0: too few timed blocks to bound anything); None for a mean."""
        if self.low is None or self.high is None:
            return None
        return Interval(self.value, self.low, self.high)


@dataclass(frozen=True)
class ProfileRun:
    """One FINISHED `profile@...` run, as the report needs it."""

    run_id: str
    started_ms: int
    machine: Machine
    combination: Combination
    device_name: str
    model_digest: str
    settings: tuple[tuple[str, str], ...]
    environment: dict[str, str]  # the `hardware.*` tags (params in older runs), prefix removed
    threads: str
    step_time: StepTime


@dataclass(frozen=True)
class LeftOut:
    run_id: str
    reason: str


def profile_run(run: Run) -> ProfileRun | LeftOut:
    """Read one MLflow run; a run that cannot be placed is left out with the reason."""
    params, tags = run.data.params, run.data.tags
    # Metrics carry a `profile/` prefix since the stage grouped them; older runs in a shared store have none.
    metrics = {
        **run.data.metrics,
        **{key[len(METRIC_PREFIX) :]: v for key, v in run.data.metrics.items() if key.startswith(METRIC_PREFIX)},
    }
    missing = [name for name in COMBINATION_PARAMS if name not in params]
    if missing:
        return LeftOut(run.info.run_id, f"no {', '.join(f'`{name}`' for name in missing)} param(s)")
    if not params["batch_size"].isdigit():
        return LeftOut(run.info.run_id, f"`batch_size` param is {params['batch_size']!r}")
    combination = Combination(int(params["batch_size"]), params["device"], params["mode"])  # type: ignore[arg-type]
    digest = tags.get(MODEL_DIGEST_TAG)
    if not digest:
        return LeftOut(run.info.run_id, f"no `{MODEL_DIGEST_TAG}` tag (logged before the tag existed)")
    # `hardware.*` are tags (older runs logged them as params; a shared store holds both kinds).
    environment = {
        key[len(HARDWARE_PREFIX) :]: value
        for key, value in {**params, **tags}.items()
        if key.startswith(HARDWARE_PREFIX)
    }
    if tags.get(ID_TAG) and tags.get(NAME_TAG):
        machine = Machine(tags[ID_TAG], tags[NAME_TAG])
    elif environment:  # logged before the machine tags existed: the same identity, from its params
        machine = Machine(machine_id(environment), machine_name(environment))
    else:
        return LeftOut(run.info.run_id, "no `machine.*` tags and no `hardware.*` tags or params")
    if MEDIAN_METRIC in metrics:
        step_time = StepTime(
            value=metrics[MEDIAN_METRIC],
            statistic="median",
            low=metrics.get(CI_LOW_METRIC),
            high=metrics.get(CI_HIGH_METRIC),
            noisy=bool(metrics.get(NOISY_METRIC, 0.0)),
            busy=bool(metrics.get(BUSY_METRIC, 0.0)),
        )
    elif MEAN_METRIC in metrics:
        step_time = StepTime(value=metrics[MEAN_METRIC], statistic="mean", cv=metrics.get(CV_METRIC))
    else:
        return LeftOut(run.info.run_id, f"no `{MEDIAN_METRIC}` or `{MEAN_METRIC}` metric")
    if not step_time.value > 0 or not math.isfinite(step_time.value):
        return LeftOut(run.info.run_id, f"step time {step_time.value!r} ms is not a positive number")
    settings = tuple(
        sorted(
            (key, value)
            for key, value in params.items()
            if key not in COMBINATION_PARAMS and key not in NOT_SETTINGS and not key.startswith(HARDWARE_PREFIX)
        )
    )
    return ProfileRun(
        run_id=run.info.run_id,
        started_ms=int(run.info.start_time or 0),
        machine=machine,
        combination=combination,
        device_name=environment.get("device_name", combination.device),
        model_digest=digest,
        settings=settings,
        environment=environment,
        threads=params.get("threads", "?"),
        step_time=step_time,
    )


def search_profile_runs(client: MlflowClient, experiment_id: str) -> list[Run]:
    """Every FINISHED profile run of the experiment, newest first (all pages)."""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.stage = '{PROFILE_STAGE}' and attributes.status = 'FINISHED'",
            max_results=SEARCH_PAGE,
            order_by=["attributes.start_time DESC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


@dataclass(frozen=True)
class GroupKey:
    model_digest: str
    settings: tuple[tuple[str, str], ...]
    statistic: str  # median or mean: estimates of different kinds are not compared


@dataclass
class Group:
    """Runs of one checkpoint and one set of settings: the latest per machine and combination."""

    key: GroupKey
    runs: list[ProfileRun]

    @property
    def machines(self) -> list[Machine]:
        return sorted({run.machine for run in self.runs}, key=lambda machine: (machine.name, machine.id))

    @property
    def latest_ms(self) -> int:
        return max(run.started_ms for run in self.runs)


def group_runs(runs: Iterable[ProfileRun]) -> tuple[list[Group], int]:
    """Comparable groups (most machines first, then most recent) and how many older runs were superseded."""
    latest: dict[tuple[GroupKey, str, Combination], ProfileRun] = {}
    superseded = 0
    for run in runs:
        slot = (GroupKey(run.model_digest, run.settings, run.step_time.statistic), run.machine.id, run.combination)
        kept = latest.get(slot)
        if kept is None or (run.started_ms, run.run_id) > (kept.started_ms, kept.run_id):
            latest[slot] = run
        superseded += kept is not None
    grouped: dict[GroupKey, list[ProfileRun]] = defaultdict(list)
    for (key, _, _), run in latest.items():
        grouped[key].append(run)
    groups = [Group(key, sorted(members, key=_row_order)) for key, members in grouped.items()]
    groups.sort(key=lambda group: (-len(group.machines), -group.latest_ms))
    return groups, superseded


def _row_order(run: ProfileRun) -> tuple[str, str, str, str, int]:
    c = run.combination
    return (run.machine.name, run.machine.id, c.device, c.mode, c.batch_size)


def display_names(machines: Iterable[Machine]) -> dict[str, str]:
    """Machine id -> the name shown; machines that share a name get a short id after it."""
    unique = set(machines)
    counts = Counter(machine.name for machine in unique)
    return {m.id: m.name if counts[m.name] == 1 else f"{m.name} [{m.id[:6]}]" for m in unique}


@dataclass(frozen=True)
class MachineRow:
    """One line of the comparison table and of machines.csv: a machine x combination of one group."""

    group: int
    machine: str
    machine_id: str
    device: str
    device_name: str
    mode: str
    batch_size: int
    statistic: str  # median (with a 95 % CI) or mean (with the CV of the steps)
    step_time_ms: float
    step_time_ms_ci_low: float | None
    step_time_ms_ci_high: float | None
    step_time_cv: float | None
    per_sample_ms: float
    per_sample_ms_ci_low: float | None
    per_sample_ms_ci_high: float | None
    throughput_samples_per_s: float
    noisy: bool
    busy: bool
    model_digest: str
    run_id: str

    @property
    def platform(self) -> tuple[str, str]:
        return (self.machine, self.device)


def machine_row(group: int, run: ProfileRun, names: Mapping[str, str]) -> MachineRow:
    step, batch = run.step_time, run.combination.batch_size
    interval = step.interval
    return MachineRow(
        group=group,
        machine=names[run.machine.id],
        machine_id=run.machine.id,
        device=run.combination.device,
        device_name=run.device_name,
        mode=run.combination.mode,
        batch_size=batch,
        statistic=step.statistic,
        step_time_ms=step.value,
        step_time_ms_ci_low=interval.low if interval else None,
        step_time_ms_ci_high=interval.high if interval else None,
        step_time_cv=step.cv,
        per_sample_ms=step.value / batch,
        per_sample_ms_ci_low=interval.low / batch if interval else None,
        per_sample_ms_ci_high=interval.high / batch if interval else None,
        throughput_samples_per_s=1000.0 * batch / step.value,
        noisy=step.noisy,
        busy=step.busy,
        model_digest=run.model_digest,
        run_id=run.run_id,
    )


@dataclass(frozen=True)
class Speedup:
    """How many times faster per sample than the baseline (baseline time ÷ this time).

    With medians, `interval` is the ratio's 95 % interval (pipeline.timing_statistics.ratio: it contains 1
    exactly when the two confidence intervals overlap, and then reads "no measurable difference").
    Means of older runs have no interval: the ratio of the two means, marked †.
    """

    group: int
    mode: str
    batch_size: int
    machine: str
    device: str
    value: float
    interval: Ratio | None

    def describe(self) -> str:
        return self.interval.describe() if self.interval else f"{self.value:.2f}x †"


def _per_sample_interval(row: MachineRow) -> Interval | None:
    if row.per_sample_ms_ci_low is None or row.per_sample_ms_ci_high is None:
        return None
    return Interval(row.per_sample_ms, row.per_sample_ms_ci_low, row.per_sample_ms_ci_high)


def speedup(group: int, baseline: MachineRow, other: MachineRow) -> Speedup:
    base, this = _per_sample_interval(baseline), _per_sample_interval(other)
    return Speedup(
        group=group,
        mode=other.mode,
        batch_size=other.batch_size,
        machine=other.machine,
        device=other.device,
        value=baseline.per_sample_ms / other.per_sample_ms,
        interval=ratio(base, this) if base and this else None,
    )


def choose_baseline(rows: Sequence[MachineRow], requested: str | None, this_machine: str | None) -> tuple[str, str]:
    """The (machine, device) others are compared with: the requested machine (name or id prefix), else
    this machine when it has rows, else the machine and device with the most rows; its CPU if it has one."""
    machines = {row.machine_id: row.machine for row in rows}
    chosen = None
    if requested:
        matches = [mid for mid, name in machines.items() if _names_machine(requested, name, mid)]
        if len(matches) > 1:
            listed = ", ".join(f"{machines[mid]} (id {mid})" for mid in matches)
            raise PipelineError(f"--baseline {requested!r} matches several machines: {listed}; pass an id instead.")
        chosen = matches[0] if matches else None  # not in this group: the default below
    if chosen is None and this_machine in machines:
        chosen = this_machine
    if chosen is None:
        counts = Counter(row.machine_id for row in rows)
        chosen = min(counts, key=lambda mid: (-counts[mid], machines[mid]))
    devices = sorted({row.device for row in rows if row.machine_id == chosen}, key=lambda name: (name != "cpu", name))
    return machines[chosen], devices[0]


def _names_machine(requested: str, shown: str, identity: str) -> bool:
    """`requested` is the machine's shown name, that name without its ` [id]` suffix, or a prefix of its id."""
    return requested in (shown, re.sub(r" \[[0-9a-f]+\]$", "", shown)) or identity.startswith(requested)


def speedups(group: int, rows: Sequence[MachineRow], baseline: tuple[str, str]) -> list[Speedup]:
    reference = {(row.mode, row.batch_size): row for row in rows if row.platform == baseline}
    return [
        speedup(group, reference[(row.mode, row.batch_size)], row)
        for row in rows
        if row.platform != baseline and (row.mode, row.batch_size) in reference
    ]


# --- markdown ------------------------------------------------------------------------------------


def _number(value: float, digits: int = 4) -> str:
    """4 significant digits, thousands as `23,136`: ms from 0.003 to 50, throughput from 100 to 300,000."""
    return f"{value:.{digits}g}" if value < 1000 else f"{value:,.0f}"


def _with_interval(value: float, low: float | None, high: float | None, digits: int = 4) -> str:
    if low is None or high is None:
        return _number(value, digits)
    if low <= 0:  # too few timed blocks for any interval: the run recorded [0, 2 x median]
        return f"{_number(value, digits)} (unbounded)"
    return f"{_number(value, digits)} ({_number(low, digits)}-{_number(high, digits)})"


def rows_markdown(rows: Sequence[MachineRow]) -> str:
    lines = [
        "| machine | device | mode | batch | estimate | step ms | per-sample ms | samples/s | run |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | --- |",
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
            step = f"{_number(row.step_time_ms)}{cv}"
            throughput = _number(row.throughput_samples_per_s)
        per_sample = _with_interval(row.per_sample_ms, row.per_sample_ms_ci_low, row.per_sample_ms_ci_high)
        lines.append(
            f"| {row.machine} | {row.device} | {row.mode} | {row.batch_size} | {estimate} | {step} | {per_sample} | "
            f"{throughput} | `{row.run_id[:8]}` |"
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
    cells = {(r.mode, r.batch_size, r.machine, r.device): r.describe() for r in ratios}
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
            f"| {names[machine_key]} | `{machine_key}` | {env.get('cpu', '?')} | {env.get('cpu_count', '?')} | "
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
    if baseline and not any(_names_machine(baseline, names[m.id], m.id) for g in groups for m in g.machines):
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
        sections.append("## Not comparable\n")
        sections.append(
            f"The runs form {len(groups)} groups that are reported apart, because they measure different things:\n"
        )
        sections.append(
            "".join(
                f"- group {index}: {len(group.machines)} machine(s), {len(group.runs)} runs; differs from group 1 in "
                f"{differences(group.key, groups[0].key)}.\n"
                for index, group in enumerate(groups[1:], start=2)
            )
        )
        sections.append(
            "\nA machine that trained its own checkpoint has its own `model.digest` (training is bit-identical "
            "only on the same CPU): to compare machines, profile one shared checkpoint (`dvc pull`, README: "
            "'Comparing machines').\n"
        )
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
        sections.append("## Runs left out\n")
        reasons = Counter(item.reason for item in left_out)
        sections.append("".join(f"- {count} run(s): {reason}.\n" for reason, count in reasons.most_common()))
        if any(MODEL_DIGEST_TAG in item.reason for item in left_out):
            sections.append(
                "\nRuns without a model digest cannot be matched to a checkpoint; rerun the profile stages on that "
                "machine (`dvc repro -f -s profile`) to log runs that carry it.\n"
            )
    return MachinesReport("\n".join(sections), rows, ratios, written)


# --- figures -------------------------------------------------------------------------------------


def batch_size_figure(rows: Sequence[MachineRow], value: Literal["per_sample", "throughput"], target: Path) -> None:
    """Per-sample time or throughput vs batch size: one panel per mode, one line per machine x device,
    with the 95 % interval as error bars where the runs have one (log-log: costs scale multiplicatively)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: servers and CI
    import matplotlib.pyplot as plt

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
    figure.savefig(target, dpi=_FIGURE_DPI)
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


# --- reading the store and writing the report ------------------------------------------------------


def read_store(uri: str, experiment: str) -> tuple[list[ProfileRun], list[LeftOut]]:
    """The experiment's FINISHED profile runs from the store at `uri`, read and sorted out."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    check_tracking_server(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        raise PipelineError(
            f"No MLflow store at {uri[len('sqlite:///') :]}: run `dvc repro` here first, or set "
            "$MLFLOW_TRACKING_URI to the store the machines log to (README: 'Comparing machines')."
        )
    client = MlflowClient(uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            known = ", ".join(sorted(e.name for e in client.search_experiments())) or "none"
            raise PipelineError(
                f"The MLflow store {uri} has no experiment {experiment!r} (it has: {known}). Pass --experiment, "
                "or check $MLFLOW_TRACKING_URI."
            )
        results = [profile_run(run) for run in search_profile_runs(client, found.experiment_id)]
    except MlflowException as error:
        raise PipelineError(f"Reading the MLflow store {uri} failed: {error.message}") from None
    runs = [result for result in results if isinstance(result, ProfileRun)]
    return runs, [result for result in results if isinstance(result, LeftOut)]


def write_report(report: MachinesReport, scratch: Path, output: Path) -> None:
    """Markdown, self-contained HTML, CSV and figures into `output`, all renamed into place at the end;
    figures of an earlier report that this one no longer has are removed."""
    from pipeline.report import markdown_to_html  # the lab report's HTML page, images inlined

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


def main(arguments: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.machines",
        description="Compare the profile runs of every machine in the MLflow tracking store "
        "($MLFLOW_TRACKING_URI, else the project's mlflow.db).",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="folder for the report (default: machines)")
    parser.add_argument("--experiment", help="MLflow experiment (default: tracking.experiment in params.yaml)")
    parser.add_argument("--baseline", help="machine the ratios are relative to: a name or id (default: this machine)")
    options = parser.parse_args(arguments)
    experiment = options.experiment
    if experiment is None:
        from pipeline.config import load_params

        experiment = load_params().tracking.experiment
    uri = tracking_uri()
    runs, left_out = read_store(uri, experiment)
    source = f"`{_without_credentials(uri)}` (experiment `{experiment}`)"
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / FIGURES).mkdir()
        report = build_machines_report(
            runs, left_out, source, Path(scratch) / FIGURES, machine_tags()[ID_TAG], options.baseline
        )
        write_report(report, Path(scratch), options.output)
    machines = len({row.machine_id for row in report.rows})
    groups = len({row.group for row in report.rows})
    print(
        f"{machines} machine(s), {len(report.rows)} rows in {groups} group(s), {len(left_out)} run(s) left out -> "
        f"{options.output / MARKDOWN_FILE}, {options.output / HTML_FILE}"
    )


def _without_credentials(uri: str) -> str:
    """`https://user:secret@host` -> `https://host`: the report may be shared."""
    return re.sub(r"//[^/@]*@", "//", uri)


if __name__ == "__main__":
    run_stage("machines report", lambda: main(sys.argv[1:]))
