"""The analysis as data: each finding is a claim, the measured quantities it cites (each with its interval and the
measurement it comes from) and the rule that licenses it. A rule that does not hold on the data yields no finding,
or the finding that the data cannot decide; the report's analysis and each hand-in's analysis are these findings,
worded by the language's message catalogue (pipeline/report/messages), so every language says the same things.

Where the numbers come from, and so what their intervals mean:
- *paired timing*: the ratios of `profiles/<device>/comparisons.json`, medians over the timing processes with their
  95 % interval (between processes; the machine's speed that all combinations shared cancels); among them the
  training step's parts (`DeviceComparisons.parts`): the step without its optimizer update, timed untraced in the
  same processes, against the full training step and against the inference step;
- *traced steps* (only of a combination whose traced pass ran like its timed steps: `TraceCheck.inside`): the parts
  of a traced step (`StepAnalysis.parts`: each ATen operator's own time, grouped by the
  phase and the layer it serves). They come from one traced pass of `profile.active_steps` steps in one process, not
  from the timing processes: their 95 % intervals are a bootstrap over those steps (resampled 5,000 times with a fixed
  seed), so they hold the step-to-step spread within that pass, not a rerun's. A ratio of two traced passes is one
  more process's worth of steps, so it explains a paired ratio only where it lies where one more timing process's
  ratio would fall (`one_more_process`), not the narrower interval of the processes' median;
- *allocator*: what a step holds at its peak, from the allocator's record of one step in each timing process;
- *FLOP count*: torch.utils.flop_counter's count of one step (exact for the operators it has formulas for).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.devices.registry import device_kind, host_kind
from pipeline.records.profile import Combination, DeviceComparisons, PairedComparison, ProfileRecord
from pipeline.records.quantities import StepPart, rounded_down, rounded_up
from pipeline.records.statistics import GRADIENTS, between_process_interval, prediction_interval
from pipeline.report.catalogue import Catalogue
from pipeline.report.comparison import rate_interval

BOOTSTRAP_DRAWS = 5000
BOOTSTRAP_SEED = 20261127
# A group's per-step time is "about the same" at two batch sizes while it grows by less than the fourth root of the
# batch ratio (2.8x from 1 to 64), and "grows with the batch" once it grows by more than its 3/4 power (22.6x from 1
# to 64); in between it grows, more slowly than the batch. Each bound is held against the whole 95 % interval.
FIXED_EXPONENT = 0.25
PROPORTIONAL_EXPONENT = 0.75
MATERIAL_SHARE = 0.02  # a group below 2 % of the traced step at both batch sizes is not worth a sentence
EXPLAINED_WITHIN = 1.5  # a traced ratio within 1.5x of the FLOP count's is what the FLOPs explain
UNDECIDED_MARGIN = 0.01  # a group's change whose interval ends within 1 % of the whole change from 0 is not named
MATERIAL_BYTES = 10_000  # a memory part under 10 kB at both batch sizes is not named
# The processes a timing interval's half-width needs shrink as 1/sqrt(n); past this many, the advice is that more
# processes would not settle it on this machine.
MOST_PROCESSES_ADVISED = 40


@dataclass(frozen=True)
class Measured:
    """A cited quantity: its value, its 95 % interval and the measurement it comes from (see the module docstring)."""

    value: float
    low: float
    high: float
    source: str  # "paired timing" | "traced steps" | "allocator" | "FLOP count" | "train stage"

    def excludes(self, point: float, margin: float = 0.0) -> bool:
        """The whole interval lies more than `margin` away from `point` (a bound within the margin is undecided: the
        bootstrap's own randomness could put it on either side)."""
        return self.low > point + margin or self.high < point - margin


@dataclass(frozen=True)
class Label:
    """A word the catalogue translates (a device, a mode, a layer group)."""

    key: str


@dataclass(frozen=True)
class Listing:
    """Several items, each worded by `message` (or its own `_message`), joined by the language's list separator."""

    message: str
    items: tuple[Mapping[str, Any], ...]
    separator: str = "list_separator"  # the catalogue key that joins them


@dataclass(frozen=True)
class Finding:
    kind: str  # the rule's name: one of RULES
    message: str  # the catalogue key of its sentence
    values: Mapping[str, Any]  # the message's placeholders (numbers, Labels, Listings)
    cites: Mapping[str, Measured] = field(default_factory=dict)  # the quantities it rests on
    reason: bool = True  # it says why, not only what

    def render(self, catalogue: Catalogue) -> str:
        return catalogue(self.message, **{name: _translated(value, catalogue) for name, value in self.values.items()})


def _translated(value: Any, catalogue: Catalogue) -> Any:
    if isinstance(value, Label):
        return catalogue(value.key)
    if isinstance(value, Listing):
        return catalogue(value.separator).join(
            catalogue(
                entry.get("_message", value.message),
                **{name: _translated(item, catalogue) for name, item in entry.items() if name != "_message"},
            )
            for entry in value.items
        )
    return value


# ---------------------------------------------------------------------------------------------------------------
# Traced steps and their bootstrap


class TracedSteps:
    """One combination's traced steps, split by part, with bootstrap draws shared by every statistic of it (so that
    shares and sums of its parts stay coherent within a draw)."""

    def __init__(self, record: ProfileRecord, seed: int) -> None:
        self.record = record
        parts = record.analysis.parts
        self.keys = [(part.phase, part.group) for part in parts]
        self.values = np.array([part.step_ms for part in parts], dtype=float)  # parts x steps
        steps = self.values.shape[1]
        picks = np.random.default_rng(seed).integers(0, steps, size=(BOOTSTRAP_DRAWS, steps))
        self.draws = self.values[:, picks].mean(axis=2)  # parts x draws: each draw's mean per step
        self.means = self.values.mean(axis=1)
        self.mflops = {(part.phase, part.group): part.mflops or 0.0 for part in parts}

    @property
    def batch(self) -> int:
        return self.record.combination.batch_size

    def rows(self, select: Callable[[str, str], bool]) -> list[int]:
        return [index for index, (phase, group) in enumerate(self.keys) if select(phase, group)]

    def mean(self, select: Callable[[str, str], bool]) -> float:
        """The selected parts' summed time per step; 0 where none is selected (as each draw's is, in draws_of)."""
        return float(self.means[self.rows(select)].sum())

    def draws_of(self, select: Callable[[str, str], bool]) -> np.ndarray:
        summed: np.ndarray = self.draws[self.rows(select)].sum(axis=0)
        return summed

    def total(self) -> float:
        return float(self.means.sum())

    def hooks_cover_outside(self) -> bool:
        """The profiler's hooks may account for all of the time outside operators: the most they add to a step (95 %,
        from the steps run untraced around the pass) is at least that time, or the steps bound nothing of them
        (`TraceCheck.hooks_unbounded`). Then "outside" says nothing of the step."""
        check = self.record.trace_check
        if check is None:
            return False
        hooks = check.hooks_high_ms
        return check.hooks_unbounded or (hooks is not None and hooks >= self.mean(of_group("outside")))

    def flops(self, select: Callable[[str, str], bool]) -> float:
        return sum(flops for key, flops in self.mflops.items() if select(*key)) * 1e6


def measured(value: float, draws: np.ndarray, source: str = "traced steps") -> Measured:
    low, high = np.percentile(draws, [2.5, 97.5])
    return Measured(value, float(low), float(high), source)


def of_group(group: str) -> Callable[[str, str], bool]:
    return lambda _phase, candidate: candidate == group


def among(groups: set[str]) -> Callable[[str, str], bool]:
    return lambda _phase, candidate: candidate in groups


def of_phase(phase: str) -> Callable[[str, str], bool]:
    return lambda candidate, _group: candidate == phase


def everything(_phase: str, _group: str) -> bool:
    return True


# ---------------------------------------------------------------------------------------------------------------
# The data the rules read


@dataclass(frozen=True)
class AnalysisData:
    records: Sequence[ProfileRecord]
    comparisons: Sequence[DeviceComparisons]
    train_speed: Mapping[str, Any] | None = None  # metrics/train_speed.json
    train_batch_size: int | None = None
    traced: Mapping[Combination, TracedSteps] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        records: Sequence[ProfileRecord],
        comparisons: Sequence[DeviceComparisons],
        train_speed: Mapping[str, Any] | None = None,
        train_batch_size: int | None = None,
    ) -> AnalysisData:
        traced = {
            record.combination: TracedSteps(record, BOOTSTRAP_SEED + position)
            for position, record in enumerate(records)
            if _parts_usable(record.analysis.parts) and record.traced_like_timed
        }
        return cls(records, comparisons, train_speed, train_batch_size, traced)

    def record(self, batch: int, device: str, mode: str) -> ProfileRecord | None:
        return next((r for r in self.records if r.combination == _at(batch, device, mode)), None)

    def batches(self, device: str, mode: str) -> list[int]:
        return sorted(
            r.combination.batch_size
            for r in self.records
            if (r.combination.device, r.combination.mode) == (device, mode)
        )

    def devices(self) -> list[str]:
        return list(dict.fromkeys(r.combination.device for r in self.records))

    def paired(self, numerator: Combination, denominator: Combination) -> PairedComparison | None:
        for found in self.comparisons:
            if found.device == numerator.device:
                return found.by_pair.get((numerator.name, denominator.name))
        return None

    def processes(self, device: str) -> int:
        return next((found.processes for found in self.comparisons if found.device == device), 0)

    def batch_pairs(self, *, consecutive: bool) -> Iterator[tuple[str, str, int, int]]:
        """(device, mode, smaller batch, larger batch): each profiled batch size with the next (`consecutive`), or the
        smallest with the largest."""
        for device in self.devices():
            for mode in _modes(self, device):
                batches = self.batches(device, mode)
                pairs = itertools.pairwise(batches) if consecutive else [(batches[0], batches[-1])]
                for small, large in pairs:
                    if small != large:
                        yield device, mode, small, large

    def traced_pairs(self, *, consecutive: bool) -> Iterator[tuple[str, str, TracedSteps, TracedSteps]]:
        """batch_pairs where both batch sizes' traced steps can be read and scaled as the timed steps did (their
        per-sample ratio ran like one more timing process, `ran_like_timed`, where the pair was timed paired): (device,
        mode, smaller's, larger's). A pair whose traced passes scaled otherwise explains nothing about the timed
        change."""
        for device, mode, a, b in self.readable_traced_pairs(consecutive=consecutive):
            if self.scaled_otherwise(a, b) is None:
                yield device, mode, a, b

    def scaled_otherwise(self, a: TracedSteps, b: TracedSteps) -> tuple[Measured, PairedComparison] | None:
        """The traced per-sample ratio and the paired one where the traced pass did not run like the timed steps
        (`ran_like_timed`); None where it did or the pair was not timed paired."""
        paired = self.paired(b.record.combination, a.record.combination)
        traced = traced_per_sample_ratio(a, b)
        return None if paired is None or ran_like_timed(traced, paired) else (traced, paired)

    def readable_traced_pairs(self, *, consecutive: bool) -> Iterator[tuple[str, str, TracedSteps, TracedSteps]]:
        """batch_pairs where both batch sizes' traced steps can be read, however they scaled."""
        for device, mode, small, large in self.batch_pairs(consecutive=consecutive):
            a, b = self.traced.get(_at(small, device, mode)), self.traced.get(_at(large, device, mode))
            if a is not None and b is not None:
                yield device, mode, a, b


def traced_per_sample_ratio(a: TracedSteps, b: TracedSteps) -> Measured:
    """The larger batch's traced time per sample over the smaller's, with its bootstrap interval."""
    small, large = a.record.combination.batch_size, b.record.combination.batch_size
    return measured(
        (b.total() / large) / (a.total() / small),
        (b.draws_of(everything) / large) / (a.draws_of(everything) / small),
    )


def _at(batch: int, device: str, mode: str) -> Combination:
    return Combination(batch, device, mode)  # type: ignore[arg-type]


def _subject(device: str, mode: str, small: int, large: int) -> dict[str, Any]:
    """The placeholders every finding about two batch sizes of a device and mode names."""
    return {"device": Label(f"device_{device}"), "mode": Label(f"mode_{mode}"), "small": small, "large": large}


def _parts_usable(parts: Sequence[StepPart]) -> bool:
    lengths = {len(part.step_ms) for part in parts}
    return bool(parts) and len(lengths) == 1 and min(lengths) >= 5


def _modes(data: AnalysisData, device: str) -> list[str]:
    return [mode for mode in ("inference", "train") if data.batches(device, mode)]


def _ratio(paired: PairedComparison) -> Measured:
    return Measured(paired.value, paired.low, paired.high, "paired timing")


def one_more_process(paired: PairedComparison) -> Measured:
    """Where one more timing process's ratio would fall, 95 %: the prediction interval from the processes' ratios
    (`prediction_interval`), never narrower than the median's own interval (one more process scatters at least as
    widely as their median is uncertain; on real data the prediction already holds it). The median's interval where
    fewer than two processes give no prediction."""
    predicted = prediction_interval(paired.process_values)
    if predicted is None:
        return _ratio(paired)
    return Measured(paired.value, min(predicted[0], paired.low), max(predicted[1], paired.high), "paired timing")


def ran_like_timed(traced: Measured, paired: PairedComparison) -> bool:
    """A ratio of traced passes ran like the timed steps: its value lies where one more timing process's ratio would
    fall (`one_more_process`). A traced pass is one more process's worth of steps, run at that process's speed; the
    interval of the processes' median narrows as processes are added, and a single process, traced or not, need not
    fall inside it. Its value, not merely its bootstrap interval: two intervals that only touch leave a traced change
    half again the timed one (a traced pass whose steps ran at two speeds), and its parts would then explain a
    change the timed steps did not make."""
    one_more = one_more_process(paired)
    return one_more.low <= traced.value <= one_more.high


def _timed_against(paired: PairedComparison) -> dict[str, float]:
    """The placeholders that say what a traced ratio was held against: the paired median with its 95 % interval and
    where one more timing process would fall."""
    one_more = one_more_process(paired)
    return {
        "paired": paired.value,
        "paired_low": paired.low,
        "paired_high": paired.high,
        "one_more_low": one_more.low,
        "one_more_high": one_more.high,
    }


def processes_to_decide(paired: PairedComparison, processes: int) -> int | None:
    """How many timing processes would bound this ratio away from 1 at the spread observed: the interval's side toward 1
    shrinks as 1/sqrt(n) until it no longer reaches 1; None where the observed ratio is 1 itself."""
    distance = abs(math.log(paired.value)) if paired.value > 0 else 0.0
    if distance == 0 or paired.low <= 0 or not math.isfinite(paired.high):
        return None
    toward_one = math.log(paired.high / paired.value) if paired.value < 1 else math.log(paired.value / paired.low)
    return max(processes + 1, math.ceil(processes * (toward_one / distance) ** 2))


# ---------------------------------------------------------------------------------------------------------------
# The rules. Each returns the findings its rule licenses on the data, and nothing where it does not hold.


def per_sample_direction(data: AnalysisData) -> list[Finding]:
    """Rule: a direction only where the paired per-sample ratio's 95 % interval excludes 1; where it includes 1, the
    finding says the data cannot tell, and how many timing processes the observed spread would need."""
    found = []
    for device, mode, small, large in data.batch_pairs(consecutive=True):
        paired = data.paired(_at(large, device, mode), _at(small, device, mode))
        if paired is None:
            continue
        ratio = _ratio(paired)
        values = {**_subject(device, mode, small, large), "ratio": paired.value, "low": paired.low, "high": paired.high}
        if ratio.excludes(1.0):
            message = "finding_per_sample_falls" if paired.value < 1 else "finding_per_sample_rises"
            found.append(Finding("per_sample_direction", message, values, {"ratio": ratio}, reason=False))
            continue
        needed = processes_to_decide(paired, data.processes(device))
        if needed is not None and needed <= MOST_PROCESSES_ADVISED:
            found.append(
                Finding(
                    "per_sample_direction",
                    "finding_per_sample_undecided_more",
                    {**values, "processes": data.processes(device), "needed": needed},
                    {"ratio": ratio},
                    reason=False,
                )
            )
        else:
            found.append(
                Finding(
                    "per_sample_direction",
                    "finding_per_sample_undecided",
                    {**values, "most": MOST_PROCESSES_ADVISED},
                    {"ratio": ratio},
                    reason=False,
                )
            )
    return found


def _group_listing(
    message: str, rows: Iterable[tuple[str, Measured]], extra: Callable[[str], Mapping[str, Any]] | None = None
) -> Listing:
    return Listing(
        message,
        tuple(
            {
                "group": Label(f"group_{group}"),
                "value": m.value,
                "low": m.low,
                "high": m.high,
                **(extra(group) if extra else {}),
            }
            for group, m in rows
        ),
    )


def _share_listing(rows: Iterable[tuple[str, Measured]]) -> Listing:
    """Groups with their share (%) of a whole change, each share's interval within 0 to 100 %. A share whose interval
    runs past 100 % is no share of the whole: it is said as its lower end ("at least", rounded down), or, where the
    whole interval lies past 100 %, as more than the whole change (the other parts together moved the other way)."""
    items = []
    for group, share in rows:
        item: dict[str, Any] = {"group": Label(f"group_{group}"), "value": share.value, "low": share.low}
        if share.low >= 100:
            item["_message"] = "finding_share_item_all"
        elif share.high > 100:
            item |= {"_message": "finding_share_item_at_least", "low": rounded_down(share.low, 1)}
        else:
            item["high"] = share.high
        items.append(item)
    return Listing("finding_share_item", tuple(items))


def _rest_said(rest: float) -> Listing:
    """What the parts a "why" finding does not name add up to, as a share (%) of the whole change: a share where it is
    one, else the direction they moved in together."""
    if round(rest, 1) < 0:  # a rest printed as 0.0 % is a share, whichever side of 0 its last digits lie
        return Listing("finding_rest_against", ({"rest": -rest},))
    if round(rest, 1) > 100:
        return Listing("finding_rest_all", ({"rest": rest},))
    return Listing("finding_rest_share", ({"rest": rest},))


GROUP_ORDER = ("optimizer", "convolution", "pool_activation_dropout", "linear", "loss", "other", "outside")


def why_per_sample_changes(data: AnalysisData) -> list[Finding]:
    """Rule: the per-sample change between two batch sizes is attributed to the groups of the traced steps only where
    the paired ratio decided its direction, the traced steps moved the same way beyond their interval, and the traced
    per-sample ratio ran like the timed steps (`ran_like_timed`); a group is named where it is at least 2 % of the
    whole change, its own change's interval lies clear of 0 by 1 % of it and its share's interval clear of 0, with its
    share of the whole change (`_share_listing`: never an interval past 100 %)."""
    found = []
    for device, mode, a, b in data.traced_pairs(consecutive=True):
        small, large = a.batch, b.batch
        paired = data.paired(_at(large, device, mode), _at(small, device, mode))
        if paired is None or not _ratio(paired).excludes(1.0):
            continue
        total = a.draws_of(everything) / small - b.draws_of(everything) / large  # saved per sample
        saved = measured(a.total() / small - b.total() / large, total)
        falls = paired.value < 1
        traced_ratio = traced_per_sample_ratio(a, b)
        if not saved.excludes(0.0) or (saved.value > 0) != falls:
            continue
        rows = []
        for group in _nameable_groups(a, b):
            select = of_group(group)
            if not a.rows(select) and not b.rows(select):
                continue
            change = a.draws_of(select) / small - b.draws_of(select) / large
            value = a.mean(select) / small - b.mean(select) / large
            if abs(value) < MATERIAL_SHARE * abs(saved.value):
                continue  # under 2 % of the whole change: not worth naming, whatever its interval
            if not measured(value, change).excludes(0.0, margin=UNDECIDED_MARGIN * abs(saved.value)):
                continue
            share = measured(100 * value / saved.value, 100 * change / total)
            if not share.excludes(0.0):
                continue  # its share of the whole change is not clear of 0 in the draws that decide both
            rows.append((group, share))
        rows.sort(key=lambda row: -row[1].value)
        helped = [row for row in rows if row[1].value > 0]
        against = [row for row in rows if row[1].value < 0]
        if not helped:
            continue
        timed = abs(a.record.timing.per_sample_ms - b.record.timing.per_sample_ms)
        rest = 100.0 - sum(share.value for _, share in rows)  # the parts this rule does not name
        values = {
            **_subject(device, mode, small, large),
            "traced_ratio": traced_ratio.value,
            "traced_low": traced_ratio.low,
            "traced_high": traced_ratio.high,
            **_timed_against(paired),
            "timed_change": timed,
            "change": abs(saved.value),
            "change_low": min(abs(saved.low), abs(saved.high)),
            "change_high": max(abs(saved.low), abs(saved.high)),
            "groups": _share_listing(helped),
            "rest": rest,
            "rest_said": _rest_said(rest),
            "against": _share_listing([(g, _negated(m)) for g, m in against]),
        }
        message = {
            (True, False): "finding_change_attributed_saved",
            (True, True): "finding_change_attributed_saved_against",
            (False, False): "finding_change_attributed_cost",
            (False, True): "finding_change_attributed_cost_against",
        }[(falls, bool(against))]
        found.append(Finding("why_per_sample_changes", message, values, {"change": saved, **dict(rows)}))
    return found


def traced_scaling_differs(data: AnalysisData) -> list[Finding]:
    """Rule: where two batch sizes' traced passes (each with the next, and the smallest with the largest) scaled
    otherwise than their paired timing (the traced per-sample ratio's interval misses where one more timing process
    would fall: `ran_like_timed`), say so once, with the traced ratio, the paired median with its interval and that
    prediction (and, where the traced ratio's interval still reaches into that prediction, that it does), and with
    what would decide it: no finding explains that change from the traced steps, and the reader should not wonder why
    none does."""
    items = []
    active_steps: set[int] = set()  # the traced passes' steps (profile.active_steps), the fewest where they differ
    pairs = [*data.readable_traced_pairs(consecutive=True), *data.readable_traced_pairs(consecutive=False)]
    seen: set[tuple[Combination, Combination]] = set()
    for device, mode, a, b in pairs:
        if (a.record.combination, b.record.combination) in seen:
            continue
        seen.add((a.record.combination, b.record.combination))
        missed = data.scaled_otherwise(a, b)
        if missed is None:
            continue
        traced, paired = missed
        reaches = _overlap(traced, one_more_process(paired))
        items.append(
            {
                **_subject(device, mode, a.record.combination.batch_size, b.record.combination.batch_size),
                "traced": traced.value,
                "traced_low": traced.low,
                "traced_high": traced.high,
                **_timed_against(paired),
                "reaches": Listing("finding_scaling_reaches", ({},)) if reaches else "",
            }
        )
        active_steps.add(a.record.settings.active_steps)
        active_steps.add(b.record.settings.active_steps)
    if not items:
        return []
    values = {"pairs": Listing("finding_scaling_item", tuple(items)), "active_steps": min(active_steps)}
    return [Finding("traced_scaling_differs", "finding_traced_scaling_differs", values, reason=False)]


def _overlap(first: Measured, second: Measured) -> bool:
    return first.low <= second.high and second.low <= first.high


def _negated(share: Measured) -> Measured:
    return Measured(-share.value, -share.high, -share.low, share.source)


def _nameable_groups(a: TracedSteps, b: TracedSteps) -> list[str]:
    """GROUP_ORDER, less the time outside operators where the profiler's hooks may be all of it in either step."""
    hooks = a.hooks_cover_outside() or b.hooks_cover_outside()
    return [group for group in GROUP_ORDER if not (group == "outside" and hooks)]


def classed_groups(
    a: TracedSteps, b: TracedSteps
) -> tuple[list[tuple[str, Measured, float]], list[tuple[str, Measured, float]]]:
    """The groups paid per step and those that grow with the batch between the traced steps `a` (the smaller batch)
    and `b`, each with its per-step growth and its time per step in `a` (see per_step_or_per_sample)."""
    scale = b.batch / a.batch
    fixed, growing = [], []
    for group in _nameable_groups(a, b):
        select = of_group(group)
        if not a.rows(select) or not b.rows(select):
            continue
        if a.mean(select) < MATERIAL_SHARE * a.total() and b.mean(select) < MATERIAL_SHARE * b.total():
            continue
        small_draws = a.draws_of(select)
        if a.mean(select) <= 0 or np.any(small_draws <= 0):
            continue
        growth = measured(b.mean(select) / a.mean(select), b.draws_of(select) / small_draws)
        if growth.high < scale**FIXED_EXPONENT:
            fixed.append((group, growth, a.mean(select)))
        elif growth.low > scale**PROPORTIONAL_EXPONENT:
            growing.append((group, growth, a.mean(select)))
    return fixed, growing


def what_sets_the_cost(data: AnalysisData) -> list[Finding]:
    """Rule: where the groups paid per step (per_step_or_per_sample) take more than half of the traced step at the
    smallest batch, and the groups that grow with the batch more than half at the largest, the whole interval of each
    share past one half, the finding says that a small batch pays mostly for the step and a large one for its
    samples."""
    found = []
    for device, mode, a, b in data.traced_pairs(consecutive=False):
        small, large = a.batch, b.batch
        fixed, growing = classed_groups(a, b)
        if not fixed or not growing:
            continue
        fixed_names = {group for group, _, _ in fixed}
        growing_names = {group for group, _, _ in growing}

        per_step = measured(
            100 * a.mean(among(fixed_names)) / a.total(),
            100 * a.draws_of(among(fixed_names)) / a.draws_of(everything),
        )
        per_sample = measured(
            100 * b.mean(among(growing_names)) / b.total(),
            100 * b.draws_of(among(growing_names)) / b.draws_of(everything),
        )
        if per_step.low <= 50 or per_sample.low <= 50:
            continue
        values = {
            **_subject(device, mode, small, large),
            "fixed": _names(group for group, _, _ in fixed),
            "growing": _names(group for group, _, _ in growing),
            "fixed_share": per_step.value,
            "fixed_low": per_step.low,
            "fixed_high": per_step.high,
            "growing_share": per_sample.value,
            "growing_low": per_sample.low,
            "growing_high": per_sample.high,
        }
        cites = {"per_step_share": per_step, "per_sample_share": per_sample}
        found.append(Finding("what_sets_the_cost", "finding_what_sets_the_cost", values, cites))
    return found


def _names(groups: Iterable[str]) -> Listing:
    return Listing("finding_group_name", tuple({"group": Label(f"group_{group}")} for group in groups), "name_joiner")


def per_step_or_per_sample(data: AnalysisData) -> list[Finding]:
    """Rule: between the smallest and the largest batch size, a group "costs about the same per step" where the whole
    interval of its per-step growth lies below batch ratio^0.25, and "grows with the batch" where it lies above batch
    ratio^0.75; groups under 2 % of the traced step at both sizes, or whose interval straddles a bound, are not
    classed."""
    found = []
    for device, mode, a, b in data.traced_pairs(consecutive=False):
        small, large = a.batch, b.batch
        scale = large / small
        fixed, growing = classed_groups(a, b)
        if not fixed and not growing:
            continue
        values = {**_subject(device, mode, small, large), "scale": scale}
        if fixed:
            found.append(
                Finding(
                    "per_step_or_per_sample",
                    "finding_fixed_per_step",
                    {
                        **values,
                        "bound": rounded_up(
                            scale**FIXED_EXPONENT, 2
                        ),  # the rule's bound: every seed that classes holds it
                        "fall": rounded_down(scale / rounded_up(scale**FIXED_EXPONENT, 2), 0),
                        "groups": Listing(
                            "finding_fixed_item",
                            tuple(
                                {
                                    "group": Label(f"group_{g}"),
                                    "small": small,
                                    "large": large,
                                    "ms": ms,
                                    "share": 100 * ms / a.total(),  # of the smaller batch's mean traced step
                                    "value": m.value,
                                    "low": m.low,
                                    "high": m.high,
                                }
                                for g, m, ms in fixed
                            ),
                        ),
                    },
                    {g: m for g, m, _ in fixed},
                )
            )
        if growing:
            found.append(
                Finding(
                    "per_step_or_per_sample",
                    "finding_grows_with_batch",
                    {
                        **values,
                        "bound": rounded_down(scale**PROPORTIONAL_EXPONENT, 1),  # the rule's bound, as above
                        "pct": rounded_down(100 * rounded_down(scale**PROPORTIONAL_EXPONENT, 1) / scale, 0),
                        "groups": _group_listing("finding_growth_item", [(g, m) for g, m, _ in growing]),
                    },
                    {g: m for g, m, _ in growing},
                )
            )
    return found


def closer_to_roof(data: AnalysisData) -> list[Finding]:
    """Rule: for a group with counted FLOPs, "ran closer to the roof" only where its achieved
    GFLOP/s at the largest batch lies above its interval at the smallest (traced steps, bootstrap), "no faster" where
    it lies below; otherwise the data cannot tell and nothing is said."""
    found = []
    for device, mode, a, b in data.traced_pairs(consecutive=False):
        small, large = a.batch, b.batch
        roof = b.record.analysis.flop_rate.peak_gflops_per_s
        for group in ("convolution", "linear"):
            select = of_group(group)
            if not a.rows(select) or not b.rows(select) or a.flops(select) <= 0 or b.flops(select) <= 0:
                continue
            rate_a = _rate(a, select)
            rate_b = _rate(b, select)
            if rate_b.low > rate_a.high:
                message = "finding_closer_to_roof" if roof > 0 else "finding_closer_to_roof_no_roof"
            elif rate_b.high < rate_a.low:
                message = "finding_not_closer_to_roof" if roof > 0 else "finding_not_closer_to_roof_no_roof"
            else:
                continue
            values = {
                **_subject(device, mode, small, large),
                "group": Label(f"group_{group}"),
                "rate_small": rate_a.value,
                "rate_small_low": rate_a.low,
                "rate_small_high": rate_a.high,
                "rate_large": rate_b.value,
                "rate_large_low": rate_b.low,
                "rate_large_high": rate_b.high,
                "roof": roof,
                "pct_small": 100 * rate_a.value / roof if roof > 0 else math.nan,
                "pct_large": 100 * rate_b.value / roof if roof > 0 else math.nan,
            }
            found.append(Finding("closer_to_roof", message, values, {"small": rate_a, "large": rate_b}))
    return found


def _rate(traced: TracedSteps, select: Callable[[str, str], bool]) -> Measured:
    """GFLOP/s of the selected parts: their FLOPs per step over their traced time per step."""
    flops = traced.flops(select)
    return measured(flops / traced.mean(select) / 1e6, flops / traced.draws_of(select) / 1e6)


def train_against_inference(data: AnalysisData) -> list[Finding]:
    """Rule: at each batch size with a paired train/inference ratio R, R is set against the FLOP count's ratio F
    (forward and backward against forward); "more than the FLOPs predict" only where R's whole interval lies above F.

    Where the device's record holds the training step's parts at this batch size (`DeviceComparisons.parts`: the full
    training step over the step without its Adadelta update, U, and that step over the inference step, W; each a
    paired per-step ratio timed untraced in the same processes, with its 95 % interval), the reason is decided from
    them alone (`_train_against_parts`): the update's share of the training step is 1 - 1/U (its interval from U's
    ends), and the excess is R over F:
    - R's interval not wholly above F: R, F, the update's share and W, no cause (`finding_train_parts_against_flops`);
    - W's whole interval at or below F: without the update the step is no dearer than its FLOPs predict, so the update
      is the whole excess (`finding_train_parts_update_explains`);
    - W's whole interval above F: the update is part of the excess, (R - W) / (R - F) of it from the medians, and
      the rest these timings do not apportion (`finding_train_parts_more_than_update`);
    - otherwise W's interval holds F, and whether any excess is left without the update the data cannot say
      (`finding_train_parts_undecided_without`).
    The traced pass's phases are added as a separate clause only where its ratio ran like the timed steps
    (`ran_like_timed`); where it did not, or its trace check set it aside, one clause says they are not used.

    Where the record has no parts (written before they were timed), the reason comes from the traced pass: the
    training step's phases (forward, backward, the optimizer's update, time outside operators) with their share of the
    traced step. A cause is said only where the traced passes ran like the timed steps (the traced ratio lies where
    one more timing process would fall: `ran_like_timed`; else the finding says what would decide it): the update is
    named as the reason where the paired ratio lies wholly beyond 1.5x the FLOP ratio and the traced ratio without the
    update within it, with its part of the traced ratio's excess over the FLOP ratio ("all of it" where without the
    update the ratio would not exceed the FLOP ratio); "the update alone does not explain it" where, without it, the
    whole interval stays beyond 1.5x. Where the traced ratio misses but the steps run untraced around the two passes
    give a ratio where one more process would fall, the processes ran like the timed ones and the traced steps
    themselves did not: a trace cannot apportion the gap, and the finding says so with each side's traced over
    untraced steps (what made them differ is not measured) and what would decide it, the parts that a rerun of the
    device's profile stage now times (`finding_train_traced_apart`); where the untraced steps miss too, the tracing
    process ran unlike the timing processes even untraced (`finding_train_process_apart`). A batch whose traced pass
    its trace check set aside gets the paired ratio against the FLOP ratio only (`_train_against_flops_only`)."""
    found = []
    for device in data.devices():
        for batch in data.batches(device, "train"):
            train, infer = _at(batch, device, "train"), _at(batch, device, "inference")
            paired = data.paired(train, infer)
            a, b = data.traced.get(train), data.traced.get(infer)
            if paired is None:
                continue
            parts = _training_parts(data, batch, device)
            if parts is not None:
                found += _train_against_parts(data, batch, device, paired, *parts)
                continue
            if a is None or b is None:
                found += _train_against_flops_only(data, batch, device, paired)
                continue
            flop_ratio = _flop_ratio(a.record, b.record)
            total = a.draws_of(everything)
            phases = _traced_phases(a)
            without = measured(
                (a.total() - a.mean(of_phase("optimizer"))) / b.total(),
                (total - a.draws_of(of_phase("optimizer"))) / b.draws_of(everything),
            )
            ratio = _ratio(paired)
            above = ratio.low > flop_ratio
            traced = traced_step_ratio(a, b)
            consistent = ran_like_timed(traced, paired)
            explained = EXPLAINED_WITHIN * flop_ratio
            values = {
                **_modes_values(device, batch, paired, flop_ratio),
                "phases": _phase_listing(phases),
                "traced_ms": a.total(),
                "inference_ms": b.total(),
                "without": without.value,
                "without_low": without.low,
                "without_high": without.high,
            }
            values |= {
                "traced_ratio": traced.value,
                "traced_low": traced.low,
                "traced_high": traced.high,
                **_timed_against(paired),
                "active_steps": min(a.record.settings.active_steps, b.record.settings.active_steps),
                "excess": _excess_said(traced.value, without.value, flop_ratio),
            }
            around = _untraced_ratio(a, b)
            one_more = one_more_process(paired)
            values |= {
                "untraced_ratio": around or 0.0,
                "train_hooks": _traced_over_untraced(a),
                "inference_hooks": _traced_over_untraced(b),
                "stage_device": device,  # the device's profile stage, `profile@<device>`, now times the parts
            }
            cites = {"ratio": ratio, "traced_ratio": traced, "without_update": without, **{p: m for p, m, _ in phases}}
            if not above:
                message = "finding_train_against_flops"
            elif not consistent and around is not None and one_more.low <= around <= one_more.high:
                message = "finding_train_traced_apart"
            elif not consistent and around is not None:
                message = "finding_train_process_apart"
            elif not consistent:
                message = "finding_train_above_flops"
            elif ratio.low > explained >= without.value:
                message = "finding_train_update_explains"
            elif without.low > explained:
                message = "finding_train_more_than_flops"
            else:
                message = "finding_train_above_flops_agree"
            found.append(Finding("train_against_inference", message, values, cites))
    return found


def update_per_step(data: AnalysisData) -> list[Finding]:
    """Rule: where the training step's parts were timed at a device's smallest and largest trained batch sizes, the
    Adadelta update's time per step at each is, in each timing process, that process's training step time times
    1 - 1/U (U: that process's full step over the step without the update); stated as the median over processes with
    the interval of their spread. Its growth from the smallest batch to the largest is taken process by process
    (the same processes timed both); the update "costs about the same per step" where the growth's whole interval
    lies below batch ratio^0.25, the bound `per_step_or_per_sample` classes a traced group by, and its time per sample
    then falls by about the batch ratio; else the times are stated, unclassed."""
    found = []
    for device in data.devices():
        ends = _parts_ends(data, device)
        if ends is None:
            continue
        small, large = ends
        per_process = [_update_ms(data, batch, device) for batch in (small, large)]
        if any(not values for values in per_process) or len(per_process[0]) != len(per_process[1]):
            continue
        (small_ms, small_low, small_high), (large_ms, large_low, large_high) = (_spread(v) for v in per_process)
        growth = _spread([b / a for a, b in zip(*per_process, strict=True) if a > 0])
        scale = large / small
        bound = rounded_up(scale**FIXED_EXPONENT, 2)
        values = {
            "device": Label(f"device_{device}"),
            "small": small,
            "large": large,
            "scale": scale,
            "bound": bound,
            "small_ms": small_ms,
            "small_low": small_low,
            "small_high": small_high,
            "large_ms": large_ms,
            "large_low": large_low,
            "large_high": large_high,
            "growth": growth[0],
            "growth_low": growth[1],
            "growth_high": growth[2],
            "small_per_sample": small_ms / small,
            "large_per_sample": large_ms / large,
        }
        cites = {
            "update_ms_small": Measured(small_ms, small_low, small_high, "paired timing"),
            "update_ms_large": Measured(large_ms, large_low, large_high, "paired timing"),
            "update_growth": Measured(*growth, "paired timing"),
        }
        values["traffic"] = _update_traffic(data.record(small, device, "train"), small_ms)
        message = "finding_update_per_step" if growth[2] < bound else "finding_update_not_classed"
        found.append(Finding("update_per_step", message, values, cites))
    return found


# The update's time within this factor above its counted bytes' time at the measured bandwidth: moving them is a
# likely pace (below that time, DRAM could not have supplied them: caches held part).
TRAFFIC_PACE = 2.0


def _update_traffic(record: ProfileRecord | None, update_ms: float) -> Listing | str:
    """What the update's counted bytes take at the device's measured memory bandwidth, beside its time per step: "a
    likely pace" only where its time lies between that and TRAFFIC_PACE times it; where its time is shorter, that the
    caches held part of the bytes; "" where the bytes or the bandwidth were not measured."""
    rate = record.analysis.flop_rate if record is not None else None
    if rate is None or rate.update_bytes_per_step <= 0 or rate.bandwidth_gb_per_s <= 0 or update_ms <= 0:
        return ""
    moving_ms = rate.update_bytes_per_step / (rate.bandwidth_gb_per_s * 1e9) * 1000
    item = {
        "update_mb": rate.update_bytes_per_step / 1e6,
        "bandwidth": rate.bandwidth_gb_per_s,
        "moving_ms": moving_ms,
        "update_ms": update_ms,
    }
    if moving_ms > update_ms:  # faster than DRAM could supply those bytes: caches held part of them
        return Listing("finding_update_traffic_cached", (item,))
    paced = update_ms <= TRAFFIC_PACE * moving_ms
    return Listing("finding_update_traffic_paced" if paced else "finding_update_traffic", (item,))


def excess_without_update(data: AnalysisData) -> list[Finding]:
    """Rule: where the training step's parts were timed at a device's smallest and largest trained batch sizes, and
    the step without the update over inference (W) is, at the smallest, wholly above the FLOP ratio F and wholly above
    W at the largest, whose median is nearer F: its excess shrinks against the inference step. What that excess costs
    per step, in each timing process the inference step's time times W - F, is then classed as the traced groups are
    (`per_step_or_per_sample`): about the same per step where its growth from the smallest batch to the largest lies
    wholly below batch ratio^0.25, growing with the batch where wholly above ratio^0.75, else in between (slower than
    the samples, more than a cost per step). No cause is measured; each branch names the likely ones as a
    hypothesis."""
    found = []
    for device in data.devices():
        ends = _parts_ends(data, device)
        if ends is None:
            continue
        small, large = ends
        first, last = _training_parts(data, small, device), _training_parts(data, large, device)
        train, infer = data.record(large, device, "train"), data.record(large, device, "inference")
        if first is None or last is None or train is None or infer is None:
            continue
        w_small, w_large, flop_ratio = first[1], last[1], _flop_ratio(train, infer)
        nearer = abs(w_large.value - flop_ratio) < abs(w_small.value - flop_ratio)
        if not (w_small.low > w_large.high and w_small.low > flop_ratio and nearer):
            continue
        per_process = [
            _excess_ms(data, batch, device, w, flop_ratio) for batch, w in ((small, w_small), (large, w_large))
        ]
        if any(not values for values in per_process) or len(per_process[0]) != len(per_process[1]):
            continue
        if min(per_process[0]) <= 0:
            continue
        scale = large / small
        growth = _spread([b / a for a, b in zip(*per_process, strict=True)])
        fixed, proportional = rounded_up(scale**FIXED_EXPONENT, 2), rounded_down(scale**PROPORTIONAL_EXPONENT, 1)
        (e_small, e_small_low, e_small_high), (e_large, e_large_low, e_large_high) = (_spread(v) for v in per_process)
        values = {
            "device": Label(f"device_{device}"),
            "small": small,
            "large": large,
            "scale": scale,
            "flop_ratio": flop_ratio,
            "fixed": fixed,
            "proportional": proportional,
            **{f"w_small{k}": v for k, v in (("", w_small.value), ("_low", w_small.low), ("_high", w_small.high))},
            **{f"w_large{k}": v for k, v in (("", w_large.value), ("_low", w_large.low), ("_high", w_large.high))},
            **{f"e_small{k}": v for k, v in (("", e_small), ("_low", e_small_low), ("_high", e_small_high))},
            **{f"e_large{k}": v for k, v in (("", e_large), ("_low", e_large_low), ("_high", e_large_high))},
            **{f"growth{k}": v for k, v in zip(("", "_low", "_high"), growth, strict=True)},
        }
        cites = {
            "without_small": _ratio(w_small),
            "without_large": _ratio(w_large),
            "excess_growth": Measured(*growth, "paired timing"),
        }
        if growth[2] < fixed:
            message = "finding_excess_without_update_per_step"
        elif growth[1] > proportional:
            message = "finding_excess_without_update_grows"
        else:
            message = "finding_excess_without_update_between"
        found.append(Finding("excess_without_update", message, values, cites))
    return found


def _excess_ms(
    data: AnalysisData, batch: int, device: str, without: PairedComparison, flop_ratio: float
) -> list[float]:
    """What the step without the update costs beyond its FLOPs' share, per step, in each timing process: the inference
    step's time times W - F (empty where the record does not give one value per process)."""
    record = data.record(batch, device, "inference")
    if record is None:
        return []
    steps, ratios = record.process_step_times_ms, without.process_values
    if not steps or len(steps) != len(ratios):
        return []
    return [ms * (w - flop_ratio) for ms, w in zip(steps, ratios, strict=True)]


def _parts_ends(data: AnalysisData, device: str) -> tuple[int, int] | None:
    """The smallest and the largest trained batch size whose training step's parts were timed, where two are."""
    batches = [b for b in data.batches(device, "train") if _training_parts(data, b, device) is not None]
    return (batches[0], batches[-1]) if len(batches) >= 2 else None


def _update_ms(data: AnalysisData, batch: int, device: str) -> list[float]:
    """The update's ms per step in each timing process: its training step time times 1 - 1/U (empty where the record
    or the parts do not give one value per process)."""
    record, parts = data.record(batch, device, "train"), _training_parts(data, batch, device)
    if record is None or parts is None:
        return []
    steps, factors = record.process_step_times_ms, parts[0].process_values
    if not steps or len(steps) != len(factors):
        return []
    return [ms * (1 - 1 / factor) for ms, factor in zip(steps, factors, strict=True)]


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    """The median of the processes' values and the interval of their spread (min-max where too few for one)."""
    low, high = between_process_interval(values) or (min(values), max(values))
    return statistics.median(values), low, high


def traced_step_ratio(a: TracedSteps, b: TracedSteps) -> Measured:
    """The traced training step's mean over the traced inference step's, with its bootstrap interval."""
    return measured(a.total() / b.total(), a.draws_of(everything) / b.draws_of(everything))


def _traced_phases(a: TracedSteps) -> list[tuple[str, Measured, float]]:
    """The traced training step's phases: (phase, its share (%) of the traced step, its mean ms per step)."""
    total = a.draws_of(everything)
    phases = []
    for phase in ("forward", "backward", "optimizer", "outside"):
        select = of_phase(phase)
        if a.rows(select):
            share = measured(100 * a.mean(select) / a.total(), 100 * a.draws_of(select) / total)
            phases.append((phase, share, a.mean(select)))
    return phases


def _phase_listing(phases: Sequence[tuple[str, Measured, float]]) -> Listing:
    return Listing(
        "finding_phase_item",
        tuple(
            {"phase": Label(f"phase_{p}"), "ms": ms, "value": m.value, "low": m.low, "high": m.high}
            for p, m, ms in phases
        ),
    )


# The messages of `_train_against_parts`, each a branch of train_against_inference's rule decided from the parts.
PARTS_MESSAGES = frozenset(
    {
        "finding_train_parts_against_flops",
        "finding_train_parts_update_explains",
        "finding_train_parts_more_than_update",
        "finding_train_parts_undecided_without",
    }
)


def _training_parts(data: AnalysisData, batch: int, device: str) -> tuple[PairedComparison, PairedComparison] | None:
    """The training step's two parts at `batch` on `device`, where its record holds both: the full step over the step
    without the update (U), and that step over the inference step (W)."""
    comparisons = next((found for found in data.comparisons if found.device == device), None)
    if comparisons is None:
        return None
    train, gradients, infer = (f"{batch}-{device}-{mode}" for mode in ("train", GRADIENTS, "inference"))
    update, without = comparisons.part(train, gradients), comparisons.part(gradients, infer)
    return None if update is None or without is None else (update, without)


def update_share(update: PairedComparison) -> Measured:
    """What leaving the update out saves of the training step (%), 1 - 1/U, from the full step over the step without it
    (U); its interval from U's, the saving rising with U."""
    return Measured(
        100 * (1 - 1 / update.value), 100 * (1 - 1 / update.low), 100 * (1 - 1 / update.high), "paired timing"
    )


def _train_against_parts(
    data: AnalysisData,
    batch: int,
    device: str,
    paired: PairedComparison,
    update: PairedComparison,
    without_update: PairedComparison,
) -> list[Finding]:
    """Training against inference decided from the training step's parts, timed untraced beside it (see
    train_against_inference's rule); the traced pass's phases only as a separate clause, where it ran like the timed
    steps."""
    train, infer = data.record(batch, device, "train"), data.record(batch, device, "inference")
    if train is None or infer is None:
        return []
    flop_ratio = _flop_ratio(train, infer)
    ratio, factor, without, share = _ratio(paired), _ratio(update), _ratio(without_update), update_share(update)
    traced_clause, traced_cites = _traced_clause(data, batch, device, paired)
    values = {
        **_modes_values(device, batch, paired, flop_ratio),
        "factor": factor.value,
        "factor_low": factor.low,
        "factor_high": factor.high,
        "share": share.value,
        "share_low": share.low,
        "share_high": share.high,
        "without": without.value,
        "without_low": without.low,
        "without_high": without.high,
        "processes": data.processes(device),
        "traced": traced_clause,
    }
    cites = {
        "ratio": ratio,
        "update_factor": factor,
        "update_share": share,
        "without_update_untraced": without,
        **traced_cites,
    }
    if ratio.low <= flop_ratio:
        message = "finding_train_parts_against_flops"
    elif without.high <= flop_ratio:
        message = "finding_train_parts_update_explains"
    elif without.low > flop_ratio:
        message = "finding_train_parts_more_than_update"
        values["excess"] = 100 * (ratio.value - without.value) / (ratio.value - flop_ratio)
        parts = [
            100 * (r - w) / (r - flop_ratio)
            for r, w in zip(paired.process_values, without_update.process_values, strict=False)
            if r > flop_ratio
        ]
        if len(parts) == len(paired.process_values) == len(without_update.process_values) and parts:
            _, values["excess_low"], values["excess_high"] = _spread(parts)
    else:
        message = "finding_train_parts_undecided_without"
    return [Finding("train_against_inference", message, values, cites)]


def _traced_clause(
    data: AnalysisData, batch: int, device: str, paired: PairedComparison
) -> tuple[Listing, dict[str, Measured]]:
    """The traced pass's part in a finding decided from the parts: its phases where its ratio ran like the timed
    steps (`ran_like_timed`), with what it cites; else one clause saying they are not used, and why."""
    train, infer = _at(batch, device, "train"), _at(batch, device, "inference")
    a, b = data.traced.get(train), data.traced.get(infer)
    if a is None or b is None:
        set_aside = [Label(f"mode_{c.mode}") for c in (train, infer) if c not in data.traced]
        names = Listing("finding_mode_item", tuple({"name": name} for name in set_aside), "list_joiner")
        return Listing("finding_parts_traced_set_aside", ({"set_aside": names},)), {}
    traced = traced_step_ratio(a, b)
    against = {
        "traced_ratio": traced.value,
        "traced_low": traced.low,
        "traced_high": traced.high,
        **_timed_against(paired),
    }
    if not ran_like_timed(traced, paired):
        return Listing("finding_parts_traced_apart", (against,)), {}
    phases = _traced_phases(a)
    item = {**against, "phases": _phase_listing(phases), "traced_ms": a.total(), "inference_ms": b.total()}
    return Listing("finding_parts_traced", (item,)), {"traced_ratio": traced, **{p: m for p, m, _ in phases}}


def _modes_values(device: str, batch: int, paired: PairedComparison, flop_ratio: float) -> dict[str, Any]:
    """What every training-against-inference finding states first: the device, the batch, the paired ratio with its
    interval and the FLOP count's ratio."""
    return {
        "device": Label(f"device_{device}"),
        "batch": batch,
        "ratio": paired.value,
        "low": paired.low,
        "high": paired.high,
        "flop_ratio": flop_ratio,
    }


def _flop_ratio(train: ProfileRecord, infer: ProfileRecord) -> float:
    """The training step's counted FLOPs over the inference step's (forward and backward against forward)."""
    return train.analysis.flop_rate.flops_per_step / max(infer.analysis.flop_rate.flops_per_step, 1.0)


def _train_against_flops_only(data: AnalysisData, batch: int, device: str, paired: PairedComparison) -> list[Finding]:
    """Training against inference where a traced pass was set aside (it ran unlike its timed steps): the paired ratio
    against the FLOP count's, with no parts."""
    train, infer = data.record(batch, device, "train"), data.record(batch, device, "inference")
    if train is None or infer is None:
        return []
    flop_ratio = _flop_ratio(train, infer)
    ratio = _ratio(paired)
    set_aside = [
        Label(f"mode_{record.combination.mode}") for record in (train, infer) if record.combination not in data.traced
    ]
    values = {
        **_modes_values(device, batch, paired, flop_ratio),
        "set_aside": Listing("finding_mode_item", tuple({"name": name} for name in set_aside), "list_joiner"),
    }
    message = "finding_train_above_flops_timed" if ratio.low > flop_ratio else "finding_train_flops_timed"
    return [Finding("train_against_inference", message, values, {"ratio": ratio})]


def _untraced_ratio(a: TracedSteps, b: TracedSteps) -> float | None:
    """The ratio of the steps run untraced around the two traced passes (their medians), where both records have them:
    the same processes' speed without the profiler's hooks."""
    first, second = a.record.trace_check, b.record.trace_check
    if first is None or second is None or not first.untraced_step_ms or not second.untraced_step_ms:
        return None
    return first.untraced_step_ms / second.untraced_step_ms


def _traced_over_untraced(traced: TracedSteps) -> float:
    """The traced steps' median over the untraced steps' around them (1 where not recorded)."""
    check = traced.record.trace_check
    found = check.hooks_pct if check is not None else None
    return 1 + (found or 0.0) / 100


def _excess_said(traced: float, without: float, flop_ratio: float) -> Listing:
    """The update's part of the traced ratio's excess over the FLOP ratio, as a share (%) where it is one; "all of it"
    where without the update the traced ratio would not exceed the FLOP ratio (a share past 100 % is none); no share
    where the traced ratio has no excess."""
    if traced <= flop_ratio:
        return Listing("finding_excess_none", ({},))
    if without <= flop_ratio:
        return Listing("finding_excess_all", ({},))
    return Listing("finding_excess_share", ({"share": 100 * (traced - without) / (traced - flop_ratio)},))


def memory_by_batch(data: AnalysisData) -> list[Finding]:
    """Rule: between the smallest and the largest batch size, a memory part "stays" where its bytes differ by less
    than 1 %, is "held at one peak only" where it is nothing at one of them (the two peaks fall at different
    points of the step: that is not growth), and otherwise grows or shrinks; the numbers are the allocator's
    record."""
    found = []
    for device, mode, small, large in data.batch_pairs(consecutive=False):
        first, last = data.record(small, device, mode), data.record(large, device, mode)
        if first is None or last is None or first.memory is None or last.memory is None:
            continue
        before, after = first.memory.bytes_of, last.memory.bytes_of
        stays, grows, shrinks, moved = [], [], [], []
        for name in before:
            old, new = before[name], after.get(name, 0)
            part = Label(f"memory_{name.replace(' ', '_')}")
            if max(old, new) < MATERIAL_BYTES:
                continue
            item = {"part": part, "old": old / 1e6, "new": new / 1e6}
            if abs(new - old) <= 0.01 * max(old, new):
                stays.append({"part": part, "mb": new / 1e6})
            elif min(old, new) == 0:
                moved.append(item)  # held at one peak only: the two peaks fall at different points of the step
            elif new > old:
                grows.append(item)
            else:
                shrinks.append(item)
        if not grows and not moved:
            continue

        def listed(items: list[dict[str, Any]], message: str = "finding_memory_grows_item") -> Listing | Label:
            return Listing(message, tuple(items)) if items else Label("finding_memory_none")

        values = {
            **_subject(device, mode, small, large),
            "peak_small": first.memory.peak_mb,
            "peak_large": last.memory.peak_mb,
            "stays": listed(stays, "finding_memory_stays_item"),
            "grows": listed(grows),
            "shrinks": listed(shrinks),
            "moved": listed(moved),
        }
        message = "finding_memory"
        found.append(Finding("memory_by_batch", message, values))
    return found


def gpu_against_cpu(data: AnalysisData) -> list[Finding]:
    """Rule: on a GPU, where the step waits is the traced steps' time with no kernel running (its share, bootstrap);
    the speed-up over the CPU (unpaired: the two intervals' ends) is said to grow with the batch only where its
    interval at the largest batch lies above the one at the smallest, and the GPU's idle time per step is named as
    why only where it grew by less than the batch ratio^0.25 (a per-step cost that more samples share)."""
    found = []
    host = host_kind().name
    gpus = [device for device in data.devices() if not device_kind(device).on_host]
    for device in gpus:
        for mode in _modes(data, device):
            batches = [b for b in data.batches(device, mode) if b in data.batches(host, mode)]
            if len(batches) < 2:
                continue
            small, large = batches[0], batches[-1]
            speedups = []
            for batch in (small, large):
                cpu, gpu = data.record(batch, host, mode), data.record(batch, device, mode)
                assert cpu is not None and gpu is not None
                ratio = cpu.per_sample / gpu.per_sample
                speedups.append(Measured(ratio.value, ratio.low, ratio.high, "timing, two stages"))
            a, b = data.traced.get(_at(small, device, mode)), data.traced.get(_at(large, device, mode))
            if a is None or b is None or not speedups[1].low > speedups[0].high:
                continue
            idle = of_group("outside")
            idle_small = measured(100 * a.mean(idle) / a.total(), 100 * a.draws_of(idle) / a.draws_of(everything))
            idle_large = measured(100 * b.mean(idle) / b.total(), 100 * b.draws_of(idle) / b.draws_of(everything))
            growth = measured(b.mean(idle) / a.mean(idle), b.draws_of(idle) / a.draws_of(idle))
            if not growth.high < (large / small) ** FIXED_EXPONENT:
                continue
            values = {
                **_subject(device, mode, small, large),
                "speedup_small": speedups[0].value,
                "speedup_small_low": speedups[0].low,
                "speedup_small_high": speedups[0].high,
                "speedup_large": speedups[1].value,
                "speedup_large_low": speedups[1].low,
                "speedup_large_high": speedups[1].high,
                "idle_small": idle_small.value,
                "idle_large": idle_large.value,
                "idle_ms_small": a.mean(idle),
                "idle_ms_large": b.mean(idle),
                "bound": rounded_up((large / small) ** FIXED_EXPONENT, 1),
                "scale": large / small,
            }
            cites = {"speedup_small": speedups[0], "speedup_large": speedups[1], "idle_growth": growth}
            found.append(Finding("gpu_against_cpu", "finding_gpu_speedup_grows", values, cites))
    return found


def training_against_profile(data: AnalysisData) -> list[Finding]:
    """Rule: the train stage's images/s is set against the profiled training step at the same batch size, and the
    settings in which the two runs differ are listed; nothing measures each difference's part, so the finding says
    that the data cannot apportion the gap."""
    speed = data.train_speed
    if not speed or not data.train_batch_size:
        return []
    record = next(
        (
            r
            for r in data.records
            if r.combination.mode == "train"
            and r.combination.batch_size == data.train_batch_size
            and r.combination.device == str(speed.get("runtime", {}).get("device", host_kind().name))
        ),
        None,
    )
    if record is None:
        return []
    runtime = speed.get("runtime", {})
    profiled = rate_interval(1000.0 * record.combination.batch_size, record.timing.step_interval)  # samples/s
    trained = float(speed["images_per_second"])
    differences = []
    threads = runtime.get("threads")
    if threads is not None and int(threads) != record.settings.threads:
        differences.append({"what": Label("difference_threads"), "train": threads, "profile": record.settings.threads})
    precision = runtime.get("precision")
    if precision is not None and str(precision) != record.settings.precision:
        differences.append(
            {"what": Label("difference_precision"), "train": precision, "profile": record.settings.precision}
        )
    execution = runtime.get("execution")
    if execution is not None and str(execution) not in ("eager", ""):
        differences.append({"what": Label("difference_execution"), "train": execution, "profile": "eager"})
    if speed.get("machine_busy") and not record.conditions.busy:
        differences.append({"_message": "finding_difference_busy", "share": float(speed.get("cpu_share", 0.0))})
    values = {
        "device": Label(f"device_{record.combination.device}"),
        "batch": data.train_batch_size,
        "trained": trained,
        "profiled": profiled.value,
        "profiled_low": profiled.low,
        "profiled_high": profiled.high,
        "ratio": trained / profiled.value,
        "ratio_low": trained / profiled.high,
        "ratio_high": trained / profiled.low,
        "differences": Listing("finding_difference_item", tuple(differences)),
    }
    message = "finding_training_faster" if differences else "finding_training_same_settings"
    return [Finding("training_against_profile", message, values)]


RULES: tuple[Callable[[AnalysisData], list[Finding]], ...] = (
    per_sample_direction,
    traced_scaling_differs,
    why_per_sample_changes,
    per_step_or_per_sample,
    update_per_step,
    what_sets_the_cost,
    closer_to_roof,
    train_against_inference,
    excess_without_update,
    memory_by_batch,
    gpu_against_cpu,
    training_against_profile,
)


def findings(data: AnalysisData) -> list[Finding]:
    """Every finding the data licenses, in the order the analysis tells them."""
    return [finding for rule in RULES for finding in rule(data)]
