"""Stability of the profile stage's step timing: every combination measured twice, each in a fresh process.

    python -m benchmarks.profile_stability [--repeats 2] [--goal-pct 5] [--device cpu]

For each repeat, every batch size x mode of params.yaml's `profile` section is timed in its own new
Python process, with the stage's own code path (pipeline.profiling.run.make_step + pipeline.profiling.timing.time_steps)
and settings (threads, warm-up, `ci_target_pct`, `time_budget_s`). All combinations run once before any
runs again, so the two measurements of one combination are minutes apart, as two `dvc repro`s would be.
Prints per combination the medians, each 95 % CI, their difference and the machine's load; exits 0 when
every difference is within `--goal-pct` (the goal of issue 12), 1 otherwise.

Uses models/model.pt and data/MNIST when they exist (after `dvc repro train`); otherwise an untrained
model of the same shape on random images, which costs the same per step (no step depends on the values).
Writes nothing: no profiles, no MLflow runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

from pipeline.common.machine import cpu_model, machine_fingerprint
from pipeline.params.loading import load_params
from pipeline.profiling.statistics import Interval, available_cores, cpu_pressure


def measure(batch_size: int, device_name: str, mode: str) -> dict[str, Any]:
    """One combination, in this process: what the profile stage's timing would record."""
    import torch

    from pipeline.common.paths import DATA_ROOT, MODEL_CHECKPOINT
    from pipeline.data.tensors import MEMORY_FORMAT
    from pipeline.model.network import LabNet
    from pipeline.profiling.record import Combination
    from pipeline.profiling.run import make_step, prepare_profile
    from pipeline.profiling.timing import time_steps
    from pipeline.training.runtime import select_device

    params = load_params()
    config = params.profile
    combination = Combination(batch_size, device_name, mode)  # type: ignore[arg-type]
    if MODEL_CHECKPOINT.exists() and (DATA_ROOT / "MNIST").exists():
        setup = prepare_profile(combination, config, MODEL_CHECKPOINT, DATA_ROOT)  # the stage's own set-up
        step, device = setup.step, setup.device
        inputs = "trained checkpoint, MNIST test images"
    else:
        device = select_device(device_name, param="--device")
        if config.threads:
            torch.set_num_threads(config.threads)
        torch.manual_seed(0)
        model = LabNet(params.train.model).to(device).to(memory_format=MEMORY_FORMAT)
        images = torch.randn(batch_size, 1, 28, 28, device=device).contiguous(memory_format=MEMORY_FORMAT)
        labels = torch.randint(0, 10, (batch_size,), device=device)
        step = make_step(model, combination.mode, images, labels, params.train.lr)
        inputs = "untrained model, random images"
    for _ in range(config.warmup_steps):
        step()
    timing = time_steps(step, device, batch_size, config.ci_target_pct, config.time_budget_s)
    conditions = {
        **dataclasses.asdict(timing.conditions),
        "busy": timing.conditions.busy,
        "cpu_pressure_pct": cpu_pressure(),
    }
    metrics = {**timing.record().as_metrics(), **timing.conditions.metrics()}
    return {"metrics": metrics, "conditions": conditions, "inputs": inputs}


def run_worker(batch_size: int, device: str, mode: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.profile_stability", "--worker", str(batch_size), device, mode]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"worker {batch_size}-{device}-{mode} failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def interval(metrics: dict[str, float]) -> Interval:
    return Interval(metrics["step_time_ms_median"], metrics["step_time_ms_ci_low"], metrics["step_time_ms_ci_high"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--goal-pct", type=float, default=5.0, help="largest acceptable rerun difference")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", nargs=3, metavar=("BATCH", "DEVICE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        batch, device, mode = args.worker
        print(json.dumps(measure(int(batch), device, mode)))
        return

    config = load_params().profile
    fingerprint = machine_fingerprint()
    combinations = [(batch, mode) for batch in config.batch_sizes for mode in config.modes]
    print(
        f"machine: {cpu_model()} ({fingerprint['cpu_family_model']}; {fingerprint['cpu_features']}), "
        f"{available_cores()} cores; profile.threads {config.threads or 'one per core'}, "
        f"ci_target_pct {config.ci_target_pct:g}, time_budget_s {config.time_budget_s:g}; device {args.device}; "
        f"load average at start {' '.join(f'{value:.2f}' for value in os.getloadavg())}",
        flush=True,
    )
    started = time.perf_counter()
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {combination: [] for combination in combinations}
    for repeat in range(args.repeats):
        for batch, mode in combinations:
            result = run_worker(batch, args.device, mode)
            runs[(batch, mode)].append(result)
            metrics, conditions = result["metrics"], result["conditions"]
            print(
                f"  run {repeat + 1} {batch}-{args.device}-{mode}: {metrics['step_time_ms_median']:.3f} ms "
                f"±{metrics['step_time_ci_pct']:.1f} % ({int(metrics['blocks_measured'])} blocks, "
                f"{metrics['timing_s']:.1f} s), load {conditions['load_average_before']:.2f}->"
                f"{conditions['load_average_after']:.2f}, CPU pressure (PSI avg10) {conditions['cpu_pressure_pct']} %"
                f"{' BUSY' if conditions['busy'] else ''}; {result['inputs']}",
                flush=True,
            )

    print()
    header = "| combination | " + " | ".join(f"median {r + 1} ms (CI ±%)" for r in range(args.repeats))
    print(header + " | largest difference % | CIs overlap | busy |")
    print("| --- |" + " ---: |" * args.repeats + " ---: | --- | --- |")
    misses = []
    for (batch, mode), results in runs.items():
        medians = [result["metrics"]["step_time_ms_median"] for result in results]
        difference = 100.0 * (max(medians) - min(medians)) / min(medians)
        intervals = [interval(result["metrics"]) for result in results]
        overlap = all(a.overlaps(b) for a in intervals for b in intervals)
        busy = any(result["conditions"]["busy"] for result in results)
        name = f"{batch}-{args.device}-{mode}"
        cells = " | ".join(
            f"{result['metrics']['step_time_ms_median']:.3f} (±{result['metrics']['step_time_ci_pct']:.1f})"
            for result in results
        )
        print(f"| {name} | {cells} | {difference:.1f} | {'yes' if overlap else 'no'} | {'yes' if busy else 'no'} |")
        if difference > args.goal_pct:
            misses.append(f"{name} ({difference:.1f} %{', machine busy' if busy else ''})")
    print()
    print(
        f"{len(runs) - len(misses)} of {len(runs)} combinations within {args.goal_pct:g} % between runs"
        + (f"; missed: {', '.join(misses)}" if misses else "")
        + f". {time.perf_counter() - started:.0f} s; load average at end "
        + " ".join(f"{value:.2f}" for value in os.getloadavg())
        + "."
    )
    raise SystemExit(1 if misses else 0)


if __name__ == "__main__":
    main()
