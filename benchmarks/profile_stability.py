"""Stability of the profile stage's timing: the device's combinations timed several times, as reruns of the stage.

    python -m benchmarks.profile_stability [--repeats 2] [--goal-pct 5] [--ratio-goal-pct 3] [--device cpu]

Each repeat times every batch size x mode of the device exactly as the `profile@<device>` stage does
(pipeline.profiling.processes): a new worker server, `profile.processes` fresh processes that each time all
combinations interleaved, round by round in random order, sharing `profile.time_budget_s` per combination, with the
stage's threads, warm-up and `ci_target_pct`. The repeats run one after the other, as two `dvc repro -f` would.

It prints, per repeat, each combination's step time with its 95 % CI and the processes' medians, and each paired
ratio with its 95 % CI; then two tables:

- per combination: each repeat's step time, the largest difference between repeats and which condition holds:
  `agree` (within `--goal-pct`), `inside` (every repeat inside every other repeat's interval) or `MISS`;
- per ratio: each repeat's value with its CI, whether every CI is within `--ratio-goal-pct`, and whether each later
  repeat's value lies inside the first repeat's interval.

A closing line counts the later repeats' ratios inside the first repeat's intervals (the goal: at least 90 %), beside
what intervals from that many processes give when nothing shifts between runs (`expected_inside_share`: at the
default 6 processes about 90 %, so even then a run meets the goal about half the time or less), and the ratios whose
CI is within `--ratio-goal-pct` in every repeat. Exits 1 when a combination row is `MISS` or fewer than 90 % of the
later ratios lie inside, else 0. Needs models/model.pt and data/MNIST (after `dvc repro
train`). Writes nothing: no profiles, no MLflow runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from pipeline.common.errors import PipelineError
from pipeline.common.machine import cpu_model, machine_fingerprint
from pipeline.common.paths import DATA_ROOT, MODEL_CHECKPOINT
from pipeline.devices.registry import device_names, host_kind
from pipeline.params.loading import load_params
from pipeline.profiling.processes import time_in_processes
from pipeline.profiling.worker import WorkerSpec
from pipeline.records.quantities import StepEstimate
from pipeline.records.statistics import (
    PairedRatio,
    available_cores,
    between_process_interval,
    comparison_pairs,
    paired_ratio,
)

INSIDE_GOAL = 0.90  # share of a rerun's ratios that must lie inside the first run's intervals


def verdict(estimates: list[StepEstimate], goal_pct: float) -> tuple[str, float]:
    """`agree`, `inside` or `MISS` (see the module docstring), and the largest difference in %."""
    medians = [estimate.median_ms for estimate in estimates]
    difference = 100.0 * (max(medians) - min(medians)) / min(medians)
    if difference <= goal_pct:
        return "agree", difference
    inside = all(
        other.ci_low_ms <= estimate.median_ms <= other.ci_high_ms
        for estimate in estimates
        for other in estimates
        if other is not estimate
    )
    return ("inside" if inside else "MISS"), difference


def pairs_inside(estimates: list[StepEstimate]) -> tuple[int, int]:
    """Ordered pairs (i, j), i != j, with repeat j's estimate inside repeat i's interval, and how many pairs."""
    pairs = [(a, b) for a in estimates for b in estimates if a is not b]
    return sum(a.ci_low_ms <= b.median_ms <= a.ci_high_ms for a, b in pairs), len(pairs)


def later_inside_first(ratios: list[PairedRatio]) -> tuple[int, int]:
    """Repeats after the first whose ratio lies inside the first repeat's interval, and how many there are."""
    first, later = ratios[0], ratios[1:]
    return sum(first.low <= ratio.value <= first.high for ratio in later), len(later)


def expected_inside_share(processes: int, trials: int = 20_000, seed: int = 0) -> float | None:
    """How often a rerun's ratio lands inside the first run's 95 % interval when both runs draw their processes from
    the same spread and nothing shifts between them: simulated (seeded), with the interval the report states
    (`between_process_interval`) and the median of the rerun's processes. Below 1 even then: the rerun's median has
    its own spread; and any shift between runs lowers it further. None for one process, whose interval comes from its
    rounds instead (`paired_ratio`)."""
    if processes < 2:
        return None
    rng = random.Random(seed)
    inside = 0
    for _ in range(trials):
        first = [math.exp(rng.gauss(0.0, 1.0)) for _ in range(processes)]
        rerun = statistics.median(math.exp(rng.gauss(0.0, 1.0)) for _ in range(processes))
        low, high = between_process_interval(first) or (0.0, math.inf)
        inside += low <= rerun <= high
    return inside / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, choices=range(2, 21), metavar="2-20")
    parser.add_argument("--goal-pct", type=float, default=5.0, help="largest rerun difference counted as agreement")
    parser.add_argument("--ratio-goal-pct", type=float, default=3.0, help="widest paired-ratio CI counted as narrow")
    parser.add_argument("--device", choices=device_names(), default=host_kind().name)
    parser.add_argument(
        "--servers", type=int, default=1, choices=range(1, 13), metavar="1-12", help="fresh program starts per repeat"
    )
    parser.add_argument(
        "--at-once",
        type=int,
        default=1,
        choices=range(1, 9),
        metavar="1-8",
        help="timing processes run at once, each from another program start (at most --servers)",
    )
    parser.add_argument(
        "--save",
        type=Path,
        help="write every repeat's blocks (per process, per combination, in round order) to this JSON file, to replay "
        "a stopping rule on them (benchmarks.stopping_rule)",
    )
    args = parser.parse_args()
    if not MODEL_CHECKPOINT.exists() or not (DATA_ROOT / "MNIST").exists():
        raise SystemExit(f"{MODEL_CHECKPOINT} or {DATA_ROOT / 'MNIST'} is missing: run `dvc repro train` first.")
    config = load_params().profile
    fingerprint = machine_fingerprint()
    spec = WorkerSpec.for_device(config, args.device, MODEL_CHECKPOINT, DATA_ROOT)
    items = spec.items  # the stage's: every combination, then the GRADIENTS items (the training step's parts)
    names = [f"{batch}-{args.device}-{mode}" for batch, mode in items]
    print(
        f"machine: {cpu_model()} ({fingerprint['cpu_family_model']}; {fingerprint['cpu_features']}), "
        f"{available_cores()} cores; profile.threads {config.threads or 'one per core'}, processes "
        f"{config.processes}, ci_target_pct {config.ci_target_pct:g}, time_budget_s {config.time_budget_s:g} per "
        f"combination; device {args.device}; load average at start {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    pairs = comparison_pairs(items)
    started = time.perf_counter()
    estimates: dict[str, list[StepEstimate]] = {name: [] for name in names}
    ratios: dict[tuple[int, int], list[PairedRatio]] = {(a, b): [] for a, b, _ in pairs}
    saved: list[list[list[list[float]]]] = []  # [repeat][process][combination]: per-step ms of each block
    for repeat in range(args.repeats):
        try:
            timing = time_in_processes(spec, config.processes, servers=args.servers, at_once=args.at_once)
        except PipelineError as error:
            raise SystemExit(f"repeat {repeat + 1}: {error}") from None
        saved.append([[[block.step_ms for block in item] for item in process] for process in timing.process_blocks])
        if args.save:
            args.save.write_text(json.dumps({"items": items, "machine": fingerprint, "repeats": saved}))
        for name, step in zip(names, timing.timings, strict=True):
            estimate = step.estimate
            estimates[name].append(estimate)
            print(
                f"  run {repeat + 1} {name}: {estimate.median_ms:.3f} ms [{estimate.ci_low_ms:.3f}, "
                f"{estimate.ci_high_ms:.3f}] ±{estimate.ci_half_width_pct:.1f} % from {estimate.processes} processes "
                f"({', '.join(f'{ms:.3f}' for ms in step.process_medians_ms)})"
                f"{' BUSY' if step.conditions.busy else ''}",
                flush=True,
            )
        for a, b, scale in pairs:
            blocks_a = [process[a] for process in timing.process_blocks]
            blocks_b = [process[b] for process in timing.process_blocks]
            measured = paired_ratio(blocks_a, blocks_b, scale)
            ratios[(a, b)].append(measured)
            print(
                f"  run {repeat + 1} {names[a]} / {names[b]}: {measured.value:.4f} "
                f"[{measured.low:.4f}, {measured.high:.4f}] ±{measured.half_width_pct:.1f} %",
                flush=True,
            )
    print()
    print("| combination | " + " | ".join(f"run {r + 1} ms (CI ±%)" for r in range(args.repeats)))
    print("| --- |" + " ---: |" * args.repeats + " largest difference % | holds |")
    misses = []
    for name, repeats in estimates.items():
        kind, difference = verdict(repeats, args.goal_pct)
        cells = " | ".join(f"{estimate.median_ms:.3f} (±{estimate.ci_half_width_pct:.1f})" for estimate in repeats)
        print(f"| {name} | {cells} | {difference:.1f} | {kind} |")
        if kind == "MISS":
            misses.append(name)
    print()
    print("| ratio | " + " | ".join(f"run {r + 1} (95 % CI)" for r in range(args.repeats)) + " | narrow | inside |")
    print("| --- |" + " ---: |" * args.repeats + " --- | --- |")
    inside_total = later_total = narrow_rows = 0
    for (a, b), measured_ratios in ratios.items():
        inside, later = later_inside_first(measured_ratios)
        inside_total, later_total = inside_total + inside, later_total + later
        narrow = all(ratio.half_width_pct <= args.ratio_goal_pct for ratio in measured_ratios)
        narrow_rows += narrow
        cells = " | ".join(f"{ratio.value:.4f} ({ratio.low:.4f}-{ratio.high:.4f})" for ratio in measured_ratios)
        print(f"| {names[a]} / {names[b]} | {cells} | {'yes' if narrow else 'no'} | {inside} of {later} |")
    share = inside_total / later_total if later_total else 1.0
    expected = expected_inside_share(config.processes)
    expectation = (
        f"; intervals from {config.processes} processes hold a rerun's ratio {expected:.0%} of the time with no shift "
        "between runs, simulated"
        if expected is not None
        else ""
    )
    print()
    print(
        f"{len(estimates) - len(misses)} of {len(estimates)} combinations agree or lie inside each other's intervals"
        + (f"; MISS: {', '.join(misses)}" if misses else "")
        + f". Later runs' ratios inside the first run's 95 % CI: {inside_total} of {later_total} ({share:.0%}; goal "
        f"{INSIDE_GOAL:.0%}{expectation}). Ratios with every CI within ±{args.ratio_goal_pct:g} %: {narrow_rows} of "
        f"{len(ratios)}."
        f" {time.perf_counter() - started:.0f} s; load average at end "
        + " ".join(f"{value:.2f}" for value in os.getloadavg())
        + "."
    )
    sys.exit(1 if misses or share < INSIDE_GOAL else 0)


if __name__ == "__main__":
    main()
