"""Replay the timing processes' stopping rule on blocks measured with every process run to its whole budget.

    python -m benchmarks.stopping_rule RUNS.json [RUNS.json ...] [--min-rounds 8 12 20] [--shares 0.25 0.33 0.5]

RUNS.json is what `python -m benchmarks.profile_stability --save RUNS.json` wrote: for each repeat (a rerun of the
stage's timing), each process's per-step time of every block, per combination, in round order. For each setting the
replay cuts every process where the rule (pipeline.records.statistics.known_well_enough) would have stopped it,
given the processes before it in the same repeat, and prints, against the uncut data:

- the share of rounds kept (the timing's cost, as every round costs about the same);
- the median 95 % half-width of the paired ratios (the intervals the report states), and of the step times;
- the share of later repeats' ratios inside the first repeat's interval (a rerun's landing where the report says).

Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from pipeline.records.statistics import (
    between_process_interval,
    comparison_pairs,
    known_well_enough,
    process_values,
)

Rounds = list[list[float]]  # [item][round]: per-step ms


def cut(
    process: Rounds,
    pairs: Sequence[tuple[int, int, float]],
    earlier: list[tuple[float, ...]],
    target: float,
    share: float | None,
    min_rounds: int,
) -> int:
    """Rounds the rule keeps of `process` (share None: all of them)."""
    available = len(process[0])
    if share is None:
        return available
    if share == 0:  # a fixed number of rounds
        return min(min_rounds, available)
    for rounds in range(min(min_rounds, available), available + 1):
        if known_well_enough([item[:rounds] for item in process], pairs, earlier, target, share):
            return rounds
    return available


def replay(
    repeats: list[list[Rounds]], items: list[tuple[int, str]], target: float, share: float | None, min_rounds: int
) -> tuple[float, float, float, float]:
    pairs = comparison_pairs(items)
    kept = total = 0
    intervals: list[list[tuple[float, float, float]]] = []  # [repeat][quantity]: value, low, high
    for processes in repeats:
        values: list[tuple[float, ...]] = []
        for process in processes:
            rounds = cut(process, pairs, values, target, share, min_rounds)
            kept, total = kept + rounds, total + len(process[0])
            values.append(process_values([item[:rounds] for item in process], pairs))
        found = []
        for column in zip(*values, strict=True):
            low, high = between_process_interval(column) or (0.0, float("inf"))
            found.append((statistics.median(column), low, high))
        intervals.append(found)
    width = len(items)
    ratio_half = statistics.median(100 * max(v - lo, hi - v) / v for run in intervals for v, lo, hi in run[width:])
    step_half = statistics.median(100 * max(v - lo, hi - v) / v for run in intervals for v, lo, hi in run[:width])
    first, later = intervals[0], intervals[1:]
    inside = [lo <= run[q][0] <= hi for run in later for q, (_, lo, hi) in enumerate(first) if q >= width]
    return kept / total, ratio_half, step_half, sum(inside) / len(inside) if inside else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--min-rounds", type=int, nargs="+", default=[8, 12, 20])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.25, 1 / 3, 0.5])
    parser.add_argument("--target-pct", type=float, default=2.0)
    args = parser.parse_args()
    for path in args.runs:
        saved = json.loads(path.read_text())
        items = [(int(batch), str(mode)) for batch, mode in saved["items"]]
        repeats = saved["repeats"]
        print(
            f"{path}: {len(repeats)} repeats of {len(repeats[0])} processes, "
            f"{statistics.median(len(p[0]) for r in repeats for p in r):.0f} rounds each (median)"
        )
        print("| min rounds | share | rounds kept | ratio ±% (median) | step ±% (median) | later ratios inside first |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        settings: list[tuple[int, float | None]] = [(0, None)] + [
            (m, s) for m in args.min_rounds for s in [0.0, *args.shares]
        ]
        for min_rounds, share in settings:
            kept, ratio_half, step_half, inside = replay(repeats, items, args.target_pct, share, min_rounds)
            label = "all" if share is None else "fixed" if share == 0 else f"{share:.2f}"
            print(f"| {min_rounds or '-'} | {label} | {kept:.0%} | {ratio_half:.2f} | {step_half:.2f} | {inside:.0%} |")


if __name__ == "__main__":
    main()
