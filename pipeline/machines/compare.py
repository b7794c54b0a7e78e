"""Profile runs grouped into what may be compared (same checkpoint, settings and kind of estimate),
one row per machine and combination, and the speed-up ratios against a baseline machine.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.common.errors import PipelineError
from pipeline.devices.registry import device_kind
from pipeline.machines.runs import Machine, ProfileRun
from pipeline.records.profile import Combination
from pipeline.records.quantities import Interval, Ratio


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
    peak_memory_mb: float | None = None
    energy_mj_per_sample: float | None = None

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
        peak_memory_mb=run.peak_memory_mb,
        energy_mj_per_sample=run.energy_mj_per_sample,
    )


@dataclass(frozen=True)
class Speedup:
    """How many times faster per sample than the baseline (baseline time ÷ this time).

    With medians, `interval` is the ratio's 95 % interval (pipeline.records.statistics.ratio: it contains 1
    exactly when the two confidence intervals overlap, and then reads "the data cannot tell them apart").
    Means of older runs have no interval: the ratio of the two means, marked †.
    """

    group: int
    mode: str
    batch_size: int
    machine: str
    device: str
    value: float
    interval: Ratio | None

    def with_interval(self) -> str:
        return self.interval.with_interval() if self.interval else f"{self.value:.2f}x †"


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
        interval=base / this if base and this else None,
    )


def choose_baseline(rows: Sequence[MachineRow], requested: str | None, this_machine: str | None) -> tuple[str, str]:
    """The (machine, device) others are compared with: the requested machine (name or id prefix), else
    this machine when it has rows, else the machine and device with the most rows; its CPU if it has one."""
    machines = {row.machine_id: row.machine for row in rows}
    chosen = None
    if requested:
        matches = [mid for mid, name in machines.items() if names_machine(requested, name, mid)]
        if len(matches) > 1:
            listed = ", ".join(f"{machines[mid]} (id {mid})" for mid in matches)
            raise PipelineError(f"--baseline {requested!r} matches several machines: {listed}; pass an id instead.")
        chosen = matches[0] if matches else None  # not in this group: the default below
    if chosen is None and this_machine in machines:
        chosen = this_machine
    if chosen is None:
        counts = Counter(row.machine_id for row in rows)
        chosen = min(counts, key=lambda mid: (-counts[mid], machines[mid]))
    devices = sorted(
        {row.device for row in rows if row.machine_id == chosen}, key=lambda name: (not device_kind(name).on_host, name)
    )
    return machines[chosen], devices[0]


def names_machine(requested: str, shown: str, identity: str) -> bool:
    """`requested` is the machine's shown name, that name without its ` [id]` suffix, or a prefix of its id."""
    return requested in (shown, re.sub(r" \[[0-9a-f]+\]$", "", shown)) or identity.startswith(requested)


def speedups(group: int, rows: Sequence[MachineRow], baseline: tuple[str, str]) -> list[Speedup]:
    reference = {(row.mode, row.batch_size): row for row in rows if row.platform == baseline}
    return [
        speedup(group, reference[(row.mode, row.batch_size)], row)
        for row in rows
        if row.platform != baseline and (row.mode, row.batch_size) in reference
    ]
