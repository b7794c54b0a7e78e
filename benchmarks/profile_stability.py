"""Stability of the profile stage's step timing: every combination measured several times, as reruns of the stage.

    python -m benchmarks.profile_stability [--repeats 3] [--goal-pct 5] [--device cpu]

Each repeat of a combination is timed exactly as the profile stage times it (pipeline.profiling.processes):
a new worker server, `profile.processes` fresh timing processes sharing `profile.time_budget_s`, the stage's
threads, warm-up and `ci_target_pct`. All combinations run once before any runs again, so the repeats of one
combination are minutes apart, as two `dvc repro`s would be. Prints per combination each estimate with its
stated 95 % CI (the processes' spread widened by the machine's speed drift, as the stage states it: read from
`hardware/roofs.json` when it was measured on this machine, else probed here for `profile.drift_probe_s`), the
largest difference between repeats, and which condition of issue 21 the row meets:

- `agree`: the repeats agree within `--goal-pct` (the goal); else
- `inside`: every repeat's estimate lies inside every other repeat's stated interval (the interval is honest
  about a difference it cannot resolve); else
- `MISS`: the stated intervals do not hold on a rerun.

Before each timing process and after the last it also times the drift probe's workload for `--probe-s` seconds
(in this process, on `profile.threads` threads, never beside a worker) and prints its range per run: a step that
jumps while the probe stays put moved on its own (on a Zen 5 VM, two-thread steps jumped 40 % while the probe
stayed within ±5 %: their memory-bound layers, README "Timing you can trust"); one that moves with the probe
followed the machine. `--probe-s 0`
leaves it out.

It also counts the ordered pairs (i, j) whose run j lies inside run i's interval over all rows, the calibration
test's measure: with honest 95 % intervals about 85 % of pairs are inside (simulated: six processes, the drift
known), and a row of 3 repeats has all six pairs inside only about 65 % of the time, so `MISS` rows are expected
on any machine whose repeats do not agree within the goal.

Exits 0 when every row is `agree` or `inside`, 1 otherwise. Needs models/model.pt and data/MNIST (after
`dvc repro train`). Writes nothing: no profiles, no MLflow runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch

from pipeline.common.errors import PipelineError
from pipeline.common.machine import cpu_model, machine_fingerprint
from pipeline.common.paths import DATA_ROOT, HARDWARE_ROOFS, MODEL_CHECKPOINT
from pipeline.params.loading import load_params
from pipeline.params.schema import ProfileConfig
from pipeline.profiling.peak import speed_drift
from pipeline.profiling.processes import time_in_processes
from pipeline.profiling.roofs import SpeedDrift, read_roofs
from pipeline.profiling.statistics import StepEstimate, available_cores, with_drift
from pipeline.profiling.worker import WorkerSpec


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


def machine_drift(device: str, config: ProfileConfig, fingerprint: dict[str, str]) -> tuple[SpeedDrift, str]:
    """The speed drift the profile stage would include: the roofs stage's, if measured on this machine, else probed."""
    if HARDWARE_ROOFS.exists():
        try:
            roofs = read_roofs(HARDWARE_ROOFS)
        except PipelineError:
            roofs = None
        measured = roofs.for_device(device) if roofs is not None and roofs.fingerprint == fingerprint else None
        if measured is not None:
            return measured.speed_drift, f"from {HARDWARE_ROOFS}"
    return speed_drift(torch.device(device), config.drift_probe_s), "probed now"


def _probe(device: torch.device, seconds: float, into: list[float], _: int = 0) -> None:
    """The drift probe's workload for `seconds` (one window): its median ms appended to `into` (0 s: nothing)."""
    if seconds > 0:
        into.extend(speed_drift(device, seconds, windows=1).window_medians_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--goal-pct", type=float, default=5.0, help="largest rerun difference counted as agreement")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--probe-s", type=float, default=0.3, help="drift probe before each process (0: none)")
    args = parser.parse_args()
    if not MODEL_CHECKPOINT.exists() or not (DATA_ROOT / "MNIST").exists():
        raise SystemExit(f"{MODEL_CHECKPOINT} or {DATA_ROOT / 'MNIST'} is missing: run `dvc repro train` first.")
    config = load_params().profile
    fingerprint = machine_fingerprint()
    combinations = [(batch, mode) for batch in config.batch_sizes for mode in config.modes]
    print(
        f"machine: {cpu_model()} ({fingerprint['cpu_family_model']}; {fingerprint['cpu_features']}), "
        f"{available_cores()} cores; profile.threads {config.threads or 'one per core'}, processes "
        f"{config.processes}, ci_target_pct {config.ci_target_pct:g}, time_budget_s {config.time_budget_s:g}; "
        f"device {args.device}; load average at start {' '.join(f'{value:.2f}' for value in os.getloadavg())}",
        flush=True,
    )
    if config.threads:
        torch.set_num_threads(config.threads)  # the probe runs as the timing processes do
    started = time.perf_counter()
    drift, source = machine_drift(args.device, config, fingerprint)
    print(f"speed drift ±{drift.half_width_pct:.1f} % ({source}: {drift.method})", flush=True)
    runs: dict[tuple[int, str], list[StepEstimate]] = {combination: [] for combination in combinations}
    busy: dict[tuple[int, str], bool] = {}
    all_probes: list[float] = []
    for repeat in range(args.repeats):
        for batch, mode in combinations:
            spec = WorkerSpec(
                checkpoint=str(MODEL_CHECKPOINT.resolve()),
                data_root=str(DATA_ROOT.resolve()),
                batch_size=batch,
                device=args.device,
                mode=mode,
                threads=config.threads,
                warmup_steps=config.warmup_steps,
                ci_target_pct=config.ci_target_pct,
                budget_s=config.time_budget_s,
            )
            probes: list[float] = []
            probe = functools.partial(_probe, torch.device(args.device), args.probe_s, probes)
            try:
                probe()
                timing = time_in_processes(spec, config.processes, progress=probe)
            except PipelineError as error:
                raise SystemExit(f"{batch}-{args.device}-{mode}: {error}") from None
            estimate, conditions = with_drift(timing.estimate, drift.half_width_pct), timing.conditions
            runs[(batch, mode)].append(estimate)
            all_probes.extend(probes)
            busy[(batch, mode)] = busy.get((batch, mode), False) or conditions.busy
            print(
                f"  run {repeat + 1} {batch}-{args.device}-{mode}: {estimate.median_ms:.3f} ms "
                f"[{estimate.ci_low_ms:.3f}, {estimate.ci_high_ms:.3f}] ±{estimate.ci_half_width_pct:.1f} % from "
                f"{estimate.processes} processes ({', '.join(f'{ms:.3f}' for ms in timing.process_medians_ms)}), "
                f"load {conditions.load_average_before:.2f}->{conditions.load_average_after:.2f}"
                f"{f'; probe {min(probes):.3f}-{max(probes):.3f} ms' if probes else ''}"
                f"{' BUSY' if conditions.busy else ''}",
                flush=True,
            )

    print()
    header = "| combination | " + " | ".join(f"run {r + 1} ms (CI ±%)" for r in range(args.repeats))
    print(header + " | largest difference % | holds | busy |")
    print("| --- |" + " ---: |" * args.repeats + " ---: | --- | --- |")
    misses, kinds = [], {"agree": 0, "inside": 0, "MISS": 0}
    inside_pairs = all_pairs = 0
    for (batch, mode_name), estimates in runs.items():
        kind, difference = verdict(estimates, args.goal_pct)
        inside, pairs = pairs_inside(estimates)
        inside_pairs, all_pairs = inside_pairs + inside, all_pairs + pairs
        kinds[kind] += 1
        was_busy = busy[(batch, mode_name)]
        name = f"{batch}-{args.device}-{mode_name}"
        cells = " | ".join(f"{estimate.median_ms:.3f} (±{estimate.ci_half_width_pct:.1f})" for estimate in estimates)
        print(f"| {name} | {cells} | {difference:.1f} | {kind} | {'yes' if was_busy else 'no'} |")
        if kind == "MISS":
            misses.append(f"{name} ({difference:.1f} %{', machine busy' if was_busy else ''})")
    print()
    print(
        f"{kinds['agree']} of {len(runs)} combinations agree within {args.goal_pct:g} %, {kinds['inside']} more "
        f"fall inside each other's intervals, {kinds['MISS']} miss"
        + (f": {', '.join(misses)}" if misses else "")
        + f". Ordered pairs (i, j) with run j inside run i's interval: {inside_pairs} of {all_pairs} "
        f"({100 * inside_pairs / max(all_pairs, 1):.0f} %; honest 95 % intervals give about 85 %, and then a row of "
        "3 repeats is all inside only about 2 times in 3)"
        + (
            f". The probe's workload took {min(all_probes):.3f}-{max(all_probes):.3f} ms over all runs "
            f"({100 * (max(all_probes) / min(all_probes) - 1):.0f} % apart)"
            if all_probes
            else ""
        )
        + f". {time.perf_counter() - started:.0f} s; load average at end "
        + " ".join(f"{value:.2f}" for value in os.getloadavg())
        + "."
    )
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
