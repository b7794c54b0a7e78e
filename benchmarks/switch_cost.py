"""What a step costs right after another combination's steps: the cold start that interleaved timing must keep out.

    python -m benchmarks.switch_cost [--seconds 40] [--steps 16] [--tolerance-pct 2] [--device cpu]

The profile stage times the device's combinations interleaved, one block of each per round
(pipeline.profiling.timing.time_interleaved), so every block starts right after another combination's. A short step
then starts with the other step's data in the caches and branch predictors; a block that timed that cold start
would not be the step a run of consecutive steps takes. The stage runs about `SWITCH_WARMUP_S` of the step untimed
before each block; this benchmark measures whether that covers the cold start on this machine.

All combinations of `params.yaml` are built as a timing process builds them (pipeline.profiling.worker.build_items:
same threads, warm-up and tuned allocator); then, in rounds of random order for `--seconds`, each runs `--steps`
consecutive steps, each timed alone on a device-synchronised clock. Per combination it prints the steady step time
(the median of the second half of each run's steps) and, for each of the first 8 steps after the switch, the median
over rounds of its time over the steady one; then how long the cold start lasted against the warm-up the stage gives
it. A step is warm when it lies within the noise of the steady steps themselves: `--tolerance-pct`, or the farthest
any second-half place lay from 1 if that is more. Exits 1 when a combination's first timed step, after the stage's
warm-up, is still cold, else 0. Needs models/model.pt and data/MNIST (after `dvc repro
train`); writes nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from pipeline.common.allocator import tune_allocator
from pipeline.common.machine import cpu_model, machine_fingerprint
from pipeline.common.paths import DATA_ROOT, MODEL_CHECKPOINT
from pipeline.devices.registry import device_names, host_kind
from pipeline.params.loading import load_params
from pipeline.profiling.timing import synchronizer, warmup_steps
from pipeline.profiling.worker import WorkerSpec, build_items
from pipeline.records.statistics import SWITCH_WARMUP_S

SHOWN_STEPS = 8  # steps after the switch shown in the table


def positions_over_steady(runs: list[list[float]]) -> tuple[float, list[float], float]:
    """The steady step time (the median of each run's second half, pooled); per place in the run, the median over runs
    of that step's time over the steady one; and the noise of the steady places (the farthest any second-half place
    lies from 1)."""
    half = len(runs[0]) // 2
    steady = statistics.median(seconds for run in runs for seconds in run[half:])
    ratios = [statistics.median(run[j] for run in runs) / steady for j in range(len(runs[0]))]
    return steady, ratios, max(abs(ratio - 1) for ratio in ratios[half:])


def cold_start(ratios: list[float], steady_s: float, warm_within: float) -> tuple[int, float]:
    """Steps before the first one within `warm_within` of steady, and the time they took (s)."""
    cold = next((j for j, ratio in enumerate(ratios) if ratio <= 1 + warm_within), len(ratios))
    return cold, steady_s * sum(ratios[:cold])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="rounds run for this long (wall time)")
    parser.add_argument("--steps", type=int, default=16, choices=range(SHOWN_STEPS + 4, 101), metavar="12-100")
    parser.add_argument("--tolerance-pct", type=float, default=2.0, help="a step this close to steady is warm")
    parser.add_argument("--device", choices=device_names(), default=host_kind().name)
    args = parser.parse_args()
    if not 0 < args.seconds <= 3600:
        parser.error(f"--seconds must be above 0 and at most 3600, got {args.seconds:g}")
    if not MODEL_CHECKPOINT.exists() or not (DATA_ROOT / "MNIST").exists():
        raise SystemExit(f"{MODEL_CHECKPOINT} or {DATA_ROOT / 'MNIST'} is missing: run `dvc repro train` first.")
    config = load_params().profile
    fingerprint = machine_fingerprint()
    print(
        f"machine: {cpu_model()} ({fingerprint['cpu_family_model']}; {fingerprint['cpu_features']}), device "
        f"{args.device}, profile.threads {config.threads or 'one per core'}; load average at start "
        + " ".join(f"{value:.2f}" for value in os.getloadavg()),
        flush=True,
    )
    tune_allocator()  # as every timing process (before any tensor)
    spec = WorkerSpec.for_device(config, args.device, MODEL_CHECKPOINT, DATA_ROOT)
    items = spec.items
    steps = [built.run for built in build_items(spec)]
    sync = synchronizer(torch.device(args.device))
    runs: list[list[list[float]]] = [[] for _ in steps]
    order = random.Random(0)
    deadline = time.perf_counter() + args.seconds
    while time.perf_counter() < deadline or not runs[0]:
        for index in order.sample(range(len(steps)), len(steps)):
            times, started = [], time.perf_counter()
            for _ in range(args.steps):
                steps[index]()
                sync()
                now = time.perf_counter()
                times.append(now - started)
                started = now
            runs[index].append(times)
    tolerance = args.tolerance_pct / 100
    print()
    print(
        f"Each step's time over the steady one (median over {len(runs[0])} rounds), by its place after the switch; "
        f"the stage runs {1000 * SWITCH_WARMUP_S:g} ms of the step untimed before each block:"
    )
    print()
    print(
        "| combination | steady ms | "
        + " | ".join(f"step {j + 1}" for j in range(SHOWN_STEPS))
        + " | warm within | cold start | stage's warm-up | first timed step |"
    )
    print("| --- | ---: |" + " ---: |" * SHOWN_STEPS + " ---: | ---: | ---: | ---: |")
    uncovered = []
    for (batch, mode), item_runs in zip(items, runs, strict=True):
        name = f"{batch}-{args.device}-{mode}"
        steady, ratios, noise = positions_over_steady(item_runs)
        warm_within = max(tolerance, noise)
        cold, cold_s = cold_start(ratios, steady, warm_within)
        warmup = warmup_steps(steady)  # as time_interleaved sizes it (from its fastest probe step)
        first_timed = ratios[min(warmup, len(ratios) - 1)]
        if first_timed > 1 + warm_within:
            uncovered.append(name)
        print(
            f"| {name} | {1000 * steady:.3f} | "
            + " | ".join(f"{ratio:.3f}" for ratio in ratios[:SHOWN_STEPS])
            + f" | ±{100 * warm_within:.1f} % | {cold} step{'s' if cold != 1 else ''}, {1000 * cold_s:.2f} ms | "
            f"{warmup} step{'s' if warmup != 1 else ''} | {first_timed:.3f} |"
        )
    print()
    print(
        (
            f"The stage's warm-up leaves a cold start in {', '.join(uncovered)}: raise SWITCH_WARMUP_S"
            if uncovered
            else "The stage's warm-up covers every combination's cold start (its first timed step is warm)"
        )
        + f"; load average at end {' '.join(f'{value:.2f}' for value in os.getloadavg())}."
    )
    sys.exit(1 if uncovered else 0)


if __name__ == "__main__":
    main()
