"""Step-time estimates with their uncertainty, ratios between them, and the conditions they were measured under.

Torch-free: the report stage and the tests use it without importing torch.

The estimate is the **median of per-step block means**. A block is a run of consecutive steps timed
as one (pipeline.profiling.timing makes each block >= 10 ms), so timer overhead and short jitter average out
inside it; the median over blocks ignores the rare block hit by a long stall, where a mean of steps
would not (one 40 ms stall among 30 steps of 7 ms moves the mean by 15 %).

Its 95 % confidence interval is the distribution-free order-statistic interval of the median: with n
independent blocks, the number below the true median is Binomial(n, 1/2), so
[x_(j), x_(n-j+1)] covers the true median with probability 1 - 2 P(B <= j - 1) whatever the
distribution of block times (skewed, heavy-tailed, bimodal: all seen on this lab's machines). It needs
no random numbers (the same blocks always give the same interval, unlike a bootstrap, which is also
known to be erratic for the median because the median takes few distinct values) and no normality
assumption (unlike mean ± t·s/√n). Its one assumption is that blocks are independent: slow drift
(another job starting, the CPU clock changing) correlates neighbouring blocks, and then the interval
is too narrow. Re-running in a fresh process (benchmarks/profile_stability.py) checks that.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from pipeline.records.quantities import (
    GOVERNOR_NOT_EXPOSED,
    Interval,
    MeasurementConditions,
    Ratio,
    StepEstimate,
)

CONFIDENCE = 0.95
PROCESSES_DISAGREE_ADVICE = (
    "raise `profile.processes` to pin the median down, or rerun on a quiet machine; the paired comparisons "
    "between combinations hold apart from this"
)


TWO_SPEEDS_MIN_GAP_PCT = 10.0  # a jump between processes' medians this large (and clear of their spread) is flagged

# Interleaved timing runs about this long of a step untimed before each of its blocks (none where one step is longer
# than twice this): a short step that follows another combination's block starts with cold caches and branch
# predictors, and a batch-1 CPU inference step then took far longer than warm, the excess fading within less than
# this long (docs/measurements.md); longer steps showed no such start. A block so measures the step warm, as a run
# of consecutive steps.
SWITCH_WARMUP_S = 0.003


def two_speeds(
    process_ms: Sequence[float], min_gap_pct: float = TWO_SPEEDS_MIN_GAP_PCT
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The processes' median step times split into a fast and a slow group with nothing in between: the largest
    step between neighbours (sorted) is at least `min_gap_pct` % and three times the spread inside either group.
    None when they do not split so (or there are fewer than two). On a 2-vCPU VM two-thread steps can jump like
    this while a fixed workload does not move (docs/timing.md)."""
    ordered = sorted(process_ms)
    if len(ordered) < 2 or ordered[0] <= 0:
        return None
    gaps = [100.0 * (later / earlier - 1) for earlier, later in itertools.pairwise(ordered)]
    split = max(range(len(gaps)), key=gaps.__getitem__)
    fast, slow = tuple(ordered[: split + 1]), tuple(ordered[split + 1 :])
    spread = max(100.0 * (group[-1] / group[0] - 1) for group in (fast, slow))
    return (fast, slow) if gaps[split] >= min_gap_pct and gaps[split] >= 3 * spread else None


GOVERNOR_PATH = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
CPU_PRESSURE_PATH = Path("/proc/pressure/cpu")


@dataclass(frozen=True)
class Block:
    """`steps` consecutive steps timed together in `seconds` (wall clock, device synchronised)."""

    steps: int
    seconds: float

    @property
    def step_ms(self) -> float:
        return 1000.0 * self.seconds / self.steps


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median of `values` (order statistics, exact binomial).

    Coverage is at least `confidence` (the binomial is discrete, so typically a little more); None when
    there are too few values for any such interval (fewer than 6 at 95 %: even [min, max] covers the
    median of 5 values only with probability 1 - 2/32 = 93.75 %).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    ordered = sorted(values)
    n = len(ordered)
    # Exact integer arithmetic: P(B <= j-1) <= alpha/2  <=>  2 * sum_{i<j} C(n, i) * den <= num * 2**n.
    alpha = Fraction(1 - confidence).limit_denominator(10**9)
    bound = alpha.numerator * (1 << n)
    j, tail, term = 0, 0, 1  # tail = sum of C(n, i) for i < j; term = C(n, j), updated in place (O(n) steps)
    while j < n // 2 and 2 * (tail + term) * alpha.denominator <= bound:
        tail += term
        term = term * (n - j) // (j + 1)
        j += 1
    if j == 0:
        return None
    return ordered[j - 1], ordered[n - j]


def estimate_step_time(
    blocks: Sequence[Block], batch_size: int, ci_target_pct: float, confidence: float = CONFIDENCE
) -> StepEstimate:
    """The median per-step time of `blocks` with its confidence interval and spread."""
    if not blocks:
        raise ValueError("no timed blocks: nothing to estimate")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    per_step = [block.step_ms for block in blocks]
    median = statistics.median(per_step)
    if len(per_step) >= 2:
        first, _, third = statistics.quantiles(per_step, n=4, method="inclusive")
        iqr = third - first
    else:
        iqr = 0.0
    # Too few blocks for any interval at this confidence: record [0, 2 x median], i.e. +-100 %. It bounds
    # nothing, flags the row noisy and makes every ratio with it "the data cannot tell them apart", while every
    # number stays finite for JSON, MLflow and `dvc metrics diff`.
    low, high = median_interval(per_step, confidence) or (0.0, 2.0 * median)
    return StepEstimate(
        batch_size=batch_size,
        median_ms=median,
        iqr_ms=iqr,
        ci_low_ms=low,
        ci_high_ms=high,
        steps=sum(block.steps for block in blocks),
        blocks=len(blocks),
        ci_target_pct=ci_target_pct,
    )


# Student's t, 97.5 % quantile, for 1-30 degrees of freedom (no scipy needed; checked against scipy in a test).
_T_975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
    21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
}  # fmt: skip
NORMAL_975 = 1.960  # beyond 30 degrees of freedom t is within 2 % of it


def t_975(degrees_of_freedom: int) -> float:
    """Student's t 97.5 % quantile (the two-sided 95 % interval's)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees_of_freedom}")
    return _T_975.get(degrees_of_freedom, NORMAL_975)


MIN_ORDER_STATISTIC_PROCESSES = 6  # the fewest values with a distribution-free 95 % interval of the median


def processes_disagree(noisy: bool, processes: int) -> bool:
    """A row's interval wider than its target because its processes spread (beyond the speed they shared): there
    are enough of them for a distribution-free interval and it is still too wide. With fewer processes a wide
    interval says how little so few pin the median down, not that they disagree."""
    return noisy and processes >= MIN_ORDER_STATISTIC_PROCESSES


def between_process_interval(medians: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """95 % interval of the step time from the medians of independent processes (None for fewer than 2).

    From 6 processes on, the distribution-free order-statistic interval of their median (`median_interval`).
    For 2-5 processes no such interval exists; then Student's t on the logarithms of the medians (assumes
    the process-to-process spread is log-normal, a ratio not a difference): exp(mean ± t·s/√K), widened to
    hold the median. Few processes give a wide interval (t = 12.7 for two), which is the honest answer.
    """
    values = sorted(medians)
    if len(values) >= MIN_ORDER_STATISTIC_PROCESSES:
        return median_interval(values, confidence)
    if len(values) < 2 or min(values) <= 0 or confidence != CONFIDENCE:
        return None
    logs = [math.log(value) for value in values]
    half = t_975(len(values) - 1) * statistics.stdev(logs) / math.sqrt(len(values))
    centre = statistics.fmean(logs)
    median = statistics.median(values)
    return min(math.exp(centre - half), median), max(math.exp(centre + half), median)


def prediction_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Where one more value of the kind would fall, 95 % (one more process's median, one more window's time):
    Student's t prediction interval on the logarithms, exp(mean ± t·s·√(1 + 1/K)) (None for fewer than 2 values or a
    value of 0). Log-normal, like between_process_interval: speeds spread as ratios.

    Not the interval of the median: that one narrows as values are added, while a single new one keeps the spread
    of its kind. Not order statistics either: [min, max] of 6 values holds a 7th only 5 times in 7.
    """
    if len(values) < 2 or min(values) <= 0 or confidence != CONFIDENCE:
        return None
    logs = [math.log(value) for value in values]
    half = t_975(len(logs) - 1) * statistics.stdev(logs) * math.sqrt(1 + 1 / len(logs))
    centre = statistics.fmean(logs)
    return math.exp(centre - half), math.exp(centre + half)


def estimate_over_processes(
    processes: Sequence[Sequence[Block]], batch_size: int, ci_target_pct: float
) -> StepEstimate:
    """The step time of a combination timed in several fresh processes: the median of the processes' medians,
    with the interval from the spread between processes (`between_process_interval`).

    One process gives that process's own estimate: its interval covers only the spread between its blocks,
    which a rerun in a new process need not respect.
    """
    if not processes or not all(processes):
        raise ValueError("every process must have timed blocks")
    if len(processes) == 1:
        return estimate_step_time(processes[0], batch_size, ci_target_pct)
    pooled = estimate_step_time([block for blocks in processes for block in blocks], batch_size, ci_target_pct)
    medians = [statistics.median(block.step_ms for block in blocks) for blocks in processes]
    median = statistics.median(medians)
    low, high = between_process_interval(medians) or (0.0, 2.0 * median)
    return dataclasses.replace(pooled, median_ms=median, ci_low_ms=low, ci_high_ms=high, processes=len(processes))


def process_speeds(medians: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Each process's speed factor, shared by all the items it timed: the median over items of its median over that
    item's median across processes (`medians[process][item]`; a median, so that one item's own deviation does not
    pass for the process's). 1.0 each with fewer than two items, where a shared factor cannot be told from an
    item's own spread."""
    if not medians or len(medians[0]) < 2:
        return tuple(1.0 for _ in medians)
    items = len(medians[0])
    centres = [statistics.median(process[item] for process in medians) for item in range(items)]
    return tuple(statistics.median(process[item] / centres[item] for item in range(items)) for process in medians)


def own_spread_pct(process_ms: Sequence[float], speeds: Sequence[float]) -> float:
    """The half-width (%) of the 95 % interval of one item's median once each process's shared speed factor is
    divided out: what is left is the item's own disagreement between processes (inf when it bounds nothing)."""
    own = [ms / speed for ms, speed in zip(process_ms, speeds, strict=True)]
    median = statistics.median(own)
    low, high = between_process_interval(own) or (0.0, 2.0 * median)
    return Interval(median, low, high).half_width_pct if len(own) > 1 else 0.0


@dataclass(frozen=True)
class PairedRatio(Ratio):
    """A ratio measured paired: in each process, round by round (both timed within the same round, in random
    order), its median over rounds; the value is the median of the processes' ratios, the 95 % interval their
    spread (`between_process_interval`), as Kalibera & Jones put the interval on the effect itself."""

    process_values: tuple[float, ...] = ()

    @property
    def every_process(self) -> bool:
        """Every process saw the same direction (all above 1, or all below)."""
        values = self.process_values
        return bool(values) and (all(value > 1 for value in values) or all(value < 1 for value in values))


def paired_ratio(
    numerator: Sequence[Sequence[Block]], denominator: Sequence[Sequence[Block]], scale: float = 1.0
) -> PairedRatio:
    """numerator / denominator x `scale` from blocks timed interleaved: per process (one sequence of blocks each,
    one block per round, the two aligned by round), the median over rounds of the rounds' ratios of per-step
    times. `scale` turns per-step into per-sample ratios (denominator batch / numerator batch)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("paired ratios need the same processes on both sides")
    values = []
    for ours, theirs in zip(numerator, denominator, strict=True):
        if len(ours) != len(theirs) or not ours:
            raise ValueError("paired ratios need one block of each side in every round")
        values.append(scale * statistics.median(a.step_ms / b.step_ms for a, b in zip(ours, theirs, strict=True)))
    value = statistics.median(values)
    low, high = between_process_interval(values) or (0.0, math.inf)
    if len(values) == 1:  # one process: the interval of its rounds' ratios, which a new process need not respect
        rounds = [scale * a.step_ms / b.step_ms for a, b in zip(numerator[0], denominator[0], strict=True)]
        low, high = median_interval(rounds) or (0.0, math.inf)
    return PairedRatio(value, min(low, value), max(high, value), tuple(values))


def ratio_over_pairs(numerators: Sequence[float], denominators: Sequence[float]) -> PairedRatio:
    """numerator / denominator from pairs of processes that ran one next to the other (a set-up that cannot
    change inside one process, such as glibc's allocator settings): each pair's ratio of its two medians; the value
    is their median, the 95 % interval their spread (`between_process_interval`; one pair: no interval)."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError("ratios over pairs need the same number of processes on both sides")
    values = [ours / theirs for ours, theirs in zip(numerators, denominators, strict=True)]
    value = statistics.median(values)
    low, high = between_process_interval(values) or (0.0, math.inf)
    return PairedRatio(value, min(low, value), max(high, value), tuple(values))


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_governor(path: Path = GOVERNOR_PATH) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def cpu_pressure(path: Path = CPU_PRESSURE_PATH) -> float | None:
    """`some avg10` of Linux pressure-stall information: % of the last 10 s some runnable task waited."""
    try:
        first_line = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(part.split("=", 1) for part in first_line.split()[1:] if "=" in part)
    try:
        return float(fields["avg10"])
    except (KeyError, ValueError):
        return None


def measurement_conditions(load_before: float, threads: int) -> MeasurementConditions:
    """Call right after measuring, with the load average read right before it."""
    return MeasurementConditions(
        load_average_before=load_before,
        load_average_after=load_average(),
        cores=available_cores(),
        threads=threads,
        cpu_governor=cpu_governor() or GOVERNOR_NOT_EXPOSED,
    )


# The timing item that attributes a training step's time without a profiler: the same step without the optimizer's
# update (forward, backward and clearing the gradients), timed beside the full step and the inference step in the same
# processes, so that the update's part and the backward pass's each have a paired, untraced interval.
GRADIENTS = "gradients"


def comparison_pairs(items: Sequence[tuple[int, str]]) -> tuple[tuple[int, int, float], ...]:
    """The ratios the report states between a device's items (batch size, mode), as (numerator, denominator, scale):
    per sample between each two batch sizes of one mode (the larger batch over the smaller; `scale` is the smaller
    batch over the larger), per step between the two modes of one batch size (training over inference; scale 1).
    A GRADIENTS item is set only against its batch size's others, each the more work over the less: training over
    it (the update's factor), it over inference (the backward pass's)."""
    pairs = []
    rank = {"inference": 0, GRADIENTS: 1, "train": 2}
    for first, second in itertools.combinations(range(len(items)), 2):
        (batch_a, mode_a), (batch_b, mode_b) = items[first], items[second]
        if mode_a == mode_b and batch_a != batch_b and mode_a != GRADIENTS:
            small, large = sorted((first, second), key=lambda index: items[index][0])
            pairs.append((large, small, items[small][0] / items[large][0]))
        elif batch_a == batch_b and mode_a != mode_b:
            more, less = (first, second) if rank[mode_a] > rank[mode_b] else (second, first)
            pairs.append((more, less, 1.0))
    return tuple(pairs)


def gradient_items(items: Sequence[tuple[int, str]]) -> tuple[tuple[int, str], ...]:
    """A GRADIENTS item for each batch size timed in both modes: set against both, it splits the training step's excess
    over inference into the update's part and the backward pass's, untraced (`comparison_pairs`)."""
    batches = [batch for batch, mode in items if mode == "train" and (batch, "inference") in items]
    return tuple((batch, GRADIENTS) for batch in batches)


def process_values(rounds: Sequence[Sequence[float]], pairs: Sequence[tuple[int, int, float]]) -> tuple[float, ...]:
    """What one timing process contributes to the stage's estimates: each item's median per-step time over its
    rounds (`rounds[item][round]`, ms), then each pair's median over rounds of the rounds' ratios (`paired_ratio`)."""
    medians = [statistics.median(item) for item in rounds]
    ratios = [statistics.median(round_ratios(rounds, pair)) for pair in pairs]
    return (*medians, *ratios)


def round_ratios(rounds: Sequence[Sequence[float]], pair: tuple[int, int, float]) -> list[float]:
    """A pair's ratio in each round: scale x numerator's per-step time / denominator's (`rounds[item][round]`)."""
    numerator, denominator, scale = pair
    return [scale * a / b for a, b in zip(rounds[numerator], rounds[denominator], strict=True)]


def _log_half_width(values: Sequence[float]) -> float:
    """Half the width of the median's 95 % interval of `values` on the log scale (inf where there is none)."""
    found = median_interval(values)
    if found is None or found[0] <= 0:
        return math.inf
    return (math.log(found[1]) - math.log(found[0])) / 2


# A timing process stops once every value it contributes is known within this share of the spread between processes.
# The stated interval comes from that spread; a process's own error adds to it in quadrature, so at a half-width a
# third of the processes' 95 % spread it widens the spread by at most sqrt(1 + 1/9) - 1, about 5 %
# (docs/timing.md, "How long each process times").
KNOWN_SHARE_OF_SPREAD = 1 / 3
MIN_SPREAD_PROCESSES = 3  # earlier processes needed before their spread is trusted to set a later one's stop


def known_well_enough(
    rounds: Sequence[Sequence[float]],
    pairs: Sequence[tuple[int, int, float]],
    earlier: Sequence[Sequence[float]],
    ci_target_pct: float,
    share: float = KNOWN_SHARE_OF_SPREAD,
) -> bool:
    """Whether a timing process may stop: each value it contributes (`process_values`) has a 95 % interval over its
    rounds (`rounds[item][round]`, per-step ms) within ±`ci_target_pct` %, or, once MIN_SPREAD_PROCESSES processes
    have finished (`earlier`: their values, in the same order), within `share` of their spread (the 95 % half-width
    of a normal fitted to their logarithms): known well compared with what sets the stated interval."""
    target = math.log1p(ci_target_pct / 100)
    spreads: list[float] = []
    if len(earlier) >= MIN_SPREAD_PROCESSES:
        columns = zip(*earlier, strict=True)
        spreads = [NORMAL_975 * statistics.stdev(math.log(value) for value in column) for column in columns]
    ratios = [round_ratios(rounds, pair) for pair in pairs]
    for index, values in enumerate([*rounds, *ratios]):
        allowed = max(target, share * spreads[index]) if spreads else target
        if _log_half_width(values) > allowed:
            return False
    return True
