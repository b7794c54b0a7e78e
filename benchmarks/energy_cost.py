"""What reading the energy counter during the timing costs a timing process, and whether the energies it fits agree
with windows of each step's own, on a device with an energy counter (an NVIDIA GPU).

    python -m benchmarks.energy_cost [--device cuda] [--pairs 2] [--window-s 3] [--json PATH]

Needs the checkpoint and MNIST (`dvc repro train`). Each pair is two timing processes of every combination
`params.yaml` profiles on the device, forked from one timing server as the profile stage's are: one polls the
counter during its timing (pipeline.profiling.energy_during_timing), one does not, in alternating order; each
process's wall time is taken around its answer, and each combination's median step time in it (the poller must
not slow the steps it measures). Then, in this process, the counter's update period is measured on
the idle device, and each combination runs one window of `--window-s` seconds of its own, read at both ends
(pipeline.profiling.energy.measure_energy: off by at most an update period's energy, period / window of it). The
table gives per combination the fitted energy per step (median over the polled processes, with their range) against
the window's, and the processes' times with and without the counter (median, and their ratio).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.common.allocator import tune_allocator
from pipeline.common.paths import DATA_ROOT, MODEL_CHECKPOINT
from pipeline.devices.counters import Unavailable, open_counter
from pipeline.devices.registry import device_kind
from pipeline.params.loading import load_params
from pipeline.profiling.energy import measure_energy, measure_update_period
from pipeline.profiling.processes import ask, worker_server
from pipeline.profiling.timing import synchronizer
from pipeline.profiling.worker import WorkerSpec, build_items


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device profiled (default: cuda)")
    parser.add_argument("--pairs", type=int, default=2, help="timing processes with and without the counter")
    parser.add_argument("--window-s", type=float, default=3.0, help="each combination's own window, seconds")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--counter", help="the counter to read instead of the device's (steady:WATTS:PERIOD_S: a dry run)"
    )
    args = parser.parse_args()
    config = load_params().profile
    source, why_not = (args.counter, "") if args.counter else device_kind(args.device).energy_source(0)
    if not source:
        sys.exit(f"No energy counter on {args.device}: {why_not}.")
    stage_spec = WorkerSpec.for_device(config, args.device, MODEL_CHECKPOINT, DATA_ROOT)
    # One of the stage's processes: its share of the budget (pipeline.profiling.processes.time_in_processes).
    plain = dataclasses.replace(stage_spec, budget_s=stage_spec.budget_s / config.processes)
    polled = dataclasses.replace(plain, energy=source)
    seconds: dict[str, list[float]] = {"with": [], "without": []}
    fitted: list[list[dict[str, Any]]] = []
    step_ms: dict[str, list[list[float]]] = {"with": [], "without": []}  # per process, each item's median step
    with worker_server(training="train" in config.modes, ready=True) as server:
        for pair in range(args.pairs):
            for name, spec in (("with", polled), ("without", plain))[:: 1 if pair % 2 == 0 else -1]:
                started = time.perf_counter()
                result = ask(server, dataclasses.replace(spec, seed=pair))
                seconds[name].append(time.perf_counter() - started)
                step_ms[name].append([statistics.median(block.step_ms for block in blocks) for blocks in result.blocks])
                if name == "with":
                    fitted.append(list(result.energy))
                print(f"pair {pair + 1}: a process {name} the counter took {seconds[name][-1]:.2f} s", flush=True)

    counter = open_counter(source)
    if isinstance(counter, Unavailable):
        sys.exit(f"The energy counter cannot be read: {counter.reason}.")
    period = measure_update_period(counter)
    if isinstance(period, Unavailable):
        sys.exit(f"No update period: {period.reason}.")
    tune_allocator()  # as in the timing processes, so that the steps run at their speed
    built = build_items(plain)
    sync = synchronizer(torch.device(args.device))
    rows, lines = [], []
    for index, ((batch, mode), step) in enumerate(zip(plain.items, built, strict=True)):
        window = measure_energy(step.run, sync, counter, period.longest_s, windows=1, min_window_s=args.window_s)
        found = [answers[index] for answers in fitted]
        fits = [1000 * float(answer["joules_per_step"]) for answer in found if "joules_per_step" in answer]
        powers = [float(answer["mean_power_w"]) for answer in found if "mean_power_w" in answer]
        name = f"{batch}-{args.device}-{mode}"
        rows.append(
            {
                "combination": name,
                "fitted_mj_per_step": fits,
                "fitted_power_w": powers,
                "fitted_unavailable": [answer["unavailable"] for answer in found if "unavailable" in answer],
                "window": window.reason
                if isinstance(window, Unavailable)
                else {
                    "mj_per_step": 1000 * window.joules_per_step,
                    "power_w": window.mean_power_w,
                    "error_pct": window.window_error_pct,
                },
            }
        )
        fit_text = f"{statistics.median(fits):.2f} ({min(fits):.2f}-{max(fits):.2f})" if fits else "none"
        power_text = f"{statistics.median(powers):.1f}" if powers else "none"
        steps_text = " | ".join(
            ", ".join(f"{process[index]:.4f}" for process in step_ms[kind]) for kind in ("with", "without")
        )
        if isinstance(window, Unavailable):
            lines.append(f"| {name} | {fit_text} | {window.reason} | {power_text} | none | {steps_text} |")
        else:
            lines.append(
                f"| {name} | {fit_text} | {1000 * window.joules_per_step:.2f} (±{window.window_error_pct:.1f}) | "
                f"{power_text} | {window.mean_power_w:.1f} | {steps_text} |"
            )
    figures = {
        "counter": counter.name,
        "update_period": dataclasses.asdict(period),
        "process_seconds": seconds,
        "step_ms": step_ms,
        "ratio_with_to_without": statistics.median(seconds["with"]) / statistics.median(seconds["without"]),
        "combinations": rows,
        "intervals_per_fit": [answers[0].get("windows") for answers in fitted],
    }
    print(
        f"{counter.name}: updates every {period.median_s * 1000:.1f} ms (median of {period.intervals} intervals, "
        f"{period.shortest_s * 1000:.1f}-{period.longest_s * 1000:.1f} ms{', bounded' if period.bounded else ''})"
    )
    print(
        f"timing process: {statistics.median(seconds['with']):.2f} s with the counter polled, "
        f"{statistics.median(seconds['without']):.2f} s without (ratio {figures['ratio_with_to_without']:.3f})"
    )
    print(
        "| combination | fitted mJ/step (median, range) | window mJ/step (±%) | fitted W | window W | step ms with "
        "the counter polled | without |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
