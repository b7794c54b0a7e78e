"""Time a step until its median is known to a target precision, or a time budget runs out.

After the caller's warm-up: blocks of consecutive steps are timed (each block >= `min_block_s`, so timer
overhead and short jitter average out inside it) in rounds, and after each round the 95 % confidence
interval of the median per-step time is computed over all blocks so far (pipeline.records.statistics).
Sampling stops when its half-width is within `ci_target_pct`, or when the next round would not fit in
`time_budget_s`; the estimate is then flagged noisy.

The blocks are timed by `torch.utils.benchmark.Timer.blocked_autorange`, which brings what a hand-rolled
loop would have to get right: the timing loop is timeit's compiled template (no Python bookkeeping
between steps), the clock we give it synchronises the device before each reading (CUDA work is queued
asynchronously; without it a block would time only the kernel launches), `num_threads` pins and then
restores torch's thread count, and it grows the block until the clock's own overhead is below 0.01 %
of it. Two parts of it do not fit, so they are driven from outside, through its public API only:
- Its stopping rule (`adaptive_autorange`) stops when IQR/median of the blocks falls below a threshold.
  That is the blocks' spread, which does not shrink as more blocks come in, so it cannot target the
  uncertainty of the median; we call `blocked_autorange` in short rounds and test the median's
  confidence interval between rounds.
- Its block size grows in powers of 10 from 1 step and only until the clock overhead is negligible
  (a 3.6 ms step stays a 1-step block), judged from one sample at the start of each call. We want
  blocks of at least `min_block_s`, so the timed statement runs `steps_per_call` steps, chosen from a
  short probe (Timer may still multiply it by 10; all blocks stay >= `min_block_s`). If the probe ran
  while the machine was stalled and the steps turn out much faster, blocks come out too short: the
  blocks so far are dropped and sampling restarts with longer ones, so every block averages alike.
Timer's default `num_threads` is 1: it is always passed the current thread count, or it would time a
single-threaded run and misreport the setting the stage records.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import resource
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pipeline.devices.registry import kind_of
from pipeline.records.profile import Timing
from pipeline.records.quantities import MeasurementConditions, StepEstimate
from pipeline.records.statistics import (
    SWITCH_WARMUP_S,
    Block,
    estimate_step_time,
    known_well_enough,
    load_average,
    measurement_conditions,
)

if TYPE_CHECKING:
    from torch.utils.benchmark import Timer

# Asked wherever a process resolves a device (the stage forks its timing server after `select_device`): PyTorch's
# default check initialises CUDA's driver (cudaGetDeviceCount), which does not survive a fork; this one counts
# devices through NVML and leaves the driver alone. The variable is read at each check.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


@functools.cache
def _timer_class() -> type[Timer]:
    """torch.utils.benchmark's Timer, imported on first use: in the process that times, never in a timing server.
    Its import brings torch.utils.cpp_extension (for Timer's C++ mode, unused here), which asks
    torch.cuda.is_available() wherever it finds a CUDA toolkit, to log "No CUDA runtime is found, using
    CUDA_HOME=..." (a note about compiling extensions, quieted here). Even through NVML that check starts NVML's
    own thread (named cuda0000... by the NVIDIA driver), and a server forks every timing process, so it must hold no
    thread but its own (pipeline.profiling.processes). Each timing process pays the import once: about
    a tenth of a second."""
    log = logging.getLogger("torch.utils.cpp_extension")
    previous_level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torch.utils.benchmark import Timer
    finally:
        log.setLevel(previous_level)
    return Timer


MIN_BLOCK_S = 0.010  # shortest block: ~10^4 x the clock's overhead, several scheduler ticks of jitter averaged
MIN_BLOCKS = 20  # never stop on fewer: an interval from a handful of blocks is too coarse to trust
MIN_ROUNDS = 12  # the fewest rounds a timing process stops after (docs/timing.md, "How long each process times")
PROBE_S = 0.05  # the probe that sizes the blocks (it also finishes any warm-up the caller left)
ROUND_S_LIMITS = (0.2, 2.0)  # a round is budget/10 within these: short enough to stop soon after the target


@dataclass(frozen=True)
class StepTiming:
    estimate: StepEstimate
    blocks: tuple[Block, ...]
    conditions: MeasurementConditions
    steps_per_block: int  # the most steps in one block (blocks of one measurement can differ by Timer's x10)
    seconds: float  # wall time spent, probe included
    # The median of each fresh process that timed the step (pipeline.profiling.processes); empty when timed in one.
    process_medians_ms: tuple[float, ...] = ()
    # The interval's half-width (%) with each process's shared speed divided out; None: timed alone.
    own_ci_pct: float | None = None

    def record(self, peak_memory_mb: float = 0.0, top_operator_share_pct: float = 0.0) -> Timing:
        """The profile record's timing (pipeline.records.profile): the metric names are its field names."""
        return Timing.from_estimate(
            self.estimate,
            steps_per_block=self.steps_per_block,
            timing_s=self.seconds,
            peak_memory_mb=peak_memory_mb,
            top_operator_share_pct=top_operator_share_pct,
            own_ci_pct=self.own_ci_pct,
        )


def warmup_steps(step_s: float) -> int:
    """Steps of `step_s` each run untimed before a block of interleaved timing: about SWITCH_WARMUP_S of them, none
    for a step longer than twice that. A short step right after another combination's block starts cold (a batch-1
    CPU inference step took 2.4x its warm time, the excess gone within 3 ms); a step of 7 ms or more started within
    1 % of its warm time, so a whole step run untimed would only double its share of the round (docs/timing.md)."""
    return round(SWITCH_WARMUP_S / step_s) if step_s > 0 else 1


def _steps_for(min_block_s: float, step_s: float) -> int:
    """Steps of `step_s` each that make a block of at least `min_block_s` (round: 0.01 / 2e-4 is 50.000...01)."""
    return max(1, math.ceil(round(min_block_s / step_s, 6)))


def device_clock(device: torch.device) -> Callable[[], float]:
    """A wall clock that first waits for the device's queued work (on the host: no wait, and no call around it)."""
    kind = kind_of(device)
    if kind.on_host:
        return timeit.default_timer

    def waiting_clock() -> float:
        kind.synchronize(device)
        return timeit.default_timer()

    return waiting_clock


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Wait for queued device work: without it GPU steps would time only the kernel launches."""
    kind = kind_of(device)
    return lambda: kind.synchronize(device)


FAULT_COUNT_S = 0.2  # steps counted for the page-fault rate: about this long, and at least MIN_FAULT_STEPS
MIN_FAULT_STEPS = 5


def page_faults_per_step(step: Callable[[], None], sync: Callable[[], None], step_ms: float) -> float:
    """Minor page faults per step (getrusage, the whole process), over about `FAULT_COUNT_S` of steps.

    A minor fault is the kernel handing the process a fresh zeroed page on first touch: with glibc's
    defaults a step's large buffers are mapped anew each step, so they fault in again (pipeline.common.allocator).
    """
    steps = max(MIN_FAULT_STEPS, math.ceil(FAULT_COUNT_S * 1000 / step_ms) if step_ms > 0 else MIN_FAULT_STEPS)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    sync()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


def time_steps(
    step: Callable[[], None],
    device: torch.device,
    batch_size: int,
    ci_target_pct: float,
    time_budget_s: float,
    min_block_s: float = MIN_BLOCK_S,
    clock: Callable[[], float] | None = None,
) -> StepTiming:
    """Time `step` (already warmed up) in blocks until the median's 95 % CI is within ±`ci_target_pct` %.

    Blocks are timed with `clock` (default: `device_clock(device)`); the budget is always wall time.
    """
    threads = torch.get_num_threads()
    load_before = load_average()
    started = time.perf_counter()
    deadline = started + time_budget_s
    clock = clock or device_clock(device)
    names = {"step": step}
    timer_class = _timer_class()

    def block_timer(steps_per_call: int) -> Timer:
        return timer_class(
            f"for _ in range({steps_per_call}):\n    step()", globals=names, timer=clock, num_threads=threads
        )

    probe = timer_class("step()", globals=names, timer=clock, num_threads=threads).blocked_autorange(
        min_run_time=PROBE_S
    )
    # Sized from the fastest probe block, not the median: on a busy machine a stalled probe block (a
    # descheduled thread costs a whole scheduler slice, 10-50 ms) would otherwise make blocks of 1 step.
    steps_per_call = _steps_for(min_block_s, min(probe.times))
    timer = block_timer(steps_per_call)
    # Timer first re-sizes the block (about one block of time), then times blocks for `min_run_time`.
    expected_block_s = steps_per_call * probe.median
    round_s = min(max(time_budget_s / 10, ROUND_S_LIMITS[0]), ROUND_S_LIMITS[1])
    blocks: list[Block] = []
    estimate: StepEstimate | None = None
    while True:
        remaining = deadline - time.perf_counter()
        if blocks and remaining < 2 * expected_block_s:
            break
        measurement = timer.blocked_autorange(min_run_time=max(min(round_s, remaining - expected_block_s), 0.0))
        steps = steps_per_call * measurement.number_per_run
        measured = [Block(steps, seconds) for seconds in measurement.raw_times]
        fastest_step_s = min(block.seconds / block.steps for block in measured)
        if min(block.seconds for block in measured) < min_block_s / 2 and remaining > 2 * round_s:
            # The whole probe ran on a stalled machine and the steps are far faster now: blocks came out
            # under half their length. Start over with longer blocks, so all blocks average alike.
            steps_per_call = max(steps_per_call + 1, _steps_for(min_block_s, fastest_step_s))
            timer = block_timer(steps_per_call)
            expected_block_s = steps_per_call * statistics.median(block.seconds / block.steps for block in measured)
            blocks.clear()
            continue
        blocks.extend(measured)
        estimate = estimate_step_time(blocks, batch_size, ci_target_pct)
        if len(blocks) >= MIN_BLOCKS and not estimate.noisy:
            break
    assert estimate is not None  # the loop always measures at least one round
    return StepTiming(
        estimate=estimate,
        blocks=tuple(blocks),
        conditions=measurement_conditions(load_before, threads),
        steps_per_block=max(block.steps for block in blocks),
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class InterleavedTiming:
    blocks: tuple[tuple[Block, ...], ...]  # per step, one block per round, in round order
    conditions: MeasurementConditions
    seconds: float  # wall time spent, probes included
    # (step index, start, end) on time.perf_counter of each block with its warm-up, in the order they ran: what ran
    # when, for an energy counter read meanwhile (pipeline.profiling.energy_during_timing)
    spans: tuple[tuple[int, float, float], ...] = ()
    # per step: minor page faults per step (getrusage, the whole process), the median over rounds of each block's
    # count with its warm-up; the kernel hands a fresh zeroed page on first touch (page_faults_per_step)
    page_faults: tuple[float, ...] = ()


def time_interleaved(
    steps: Sequence[Callable[[], None]],
    device: torch.device,
    ci_target_pct: float,
    time_budget_s: float,
    order: random.Random,
    min_block_s: float = MIN_BLOCK_S,
    clock: Callable[[], float] | None = None,
    pairs: Sequence[tuple[int, int, float]] = (),
    earlier: Sequence[Sequence[float]] = (),
) -> InterleavedTiming:
    """Time `steps` (warmed up) in rounds: each round times one block of every step, in an order drawn from
    `order`, so that a change of the machine's speed lands on all of them within one round.

    Each step's block is sized by its own probe to at least `min_block_s`, and follows about SWITCH_WARMUP_S of the
    same step untimed (`warmup_steps`: none for a step over twice that). Rounds go on, after at least MIN_ROUNDS,
    until every step's median and every ratio of `pairs` (numerator, denominator, scale) is known well enough
    (`known_well_enough`: within `ci_target_pct`, or within a share of the spread between the `earlier` processes'
    values), or the next round would not fit in `time_budget_s`. Blocks run timeit's compiled loop on the device
    clock; the caller has set the thread count."""
    threads = torch.get_num_threads()
    load_before = load_average()
    started = time.perf_counter()
    clock = clock or device_clock(device)
    timer_class = _timer_class()
    timers = []
    for step in steps:
        names = {"step": step}
        probe = timer_class("step()", globals=names, timer=clock, num_threads=threads).blocked_autorange(
            min_run_time=PROBE_S
        )
        steps_per_block = _steps_for(min_block_s, min(probe.times))
        warmup = warmup_steps(min(probe.times))
        # The standard library's timeit.Timer, which torch's Timer wraps: its timeit() adds no warm-up runs.
        block = timeit.Timer(f"for _ in range({steps_per_block}):\n    step()", timer=clock, globals=names)
        timers.append((block, steps_per_block, warmup, step))
    deadline = started + time_budget_s
    blocks: list[list[Block]] = [[] for _ in steps]
    faults: list[list[float]] = [[] for _ in steps]
    spans: list[tuple[int, float, float]] = []
    round_s = 0.0
    while True:
        round_started = time.perf_counter()
        if blocks[0] and deadline - round_started < round_s:
            break
        for index in order.sample(range(len(steps)), len(steps)):
            timer, steps_per_block, warmup, step = timers[index]
            span_started = time.perf_counter()  # the device is idle: the previous block ended on a synchronising clock
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # outside the timed loop, as is the warm-up
            for _ in range(warmup):
                step()
            blocks[index].append(Block(steps_per_block, timer.timeit(1)))
            spans.append((index, span_started, time.perf_counter()))
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted
            faults[index].append(faulted / (warmup + steps_per_block))
        round_s = time.perf_counter() - round_started
        if len(blocks[0]) >= MIN_ROUNDS and known_well_enough(
            [[block.step_ms for block in step_blocks] for step_blocks in blocks], pairs, earlier, ci_target_pct
        ):
            break
    return InterleavedTiming(
        blocks=tuple(tuple(step_blocks) for step_blocks in blocks),
        conditions=measurement_conditions(load_before, threads),
        seconds=time.perf_counter() - started,
        spans=tuple(spans),
        page_faults=tuple(statistics.median(counts) for counts in faults),
    )
