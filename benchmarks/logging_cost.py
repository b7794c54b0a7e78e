"""What tracking costs a training loop per step: the train stage's own epoch loop around a step that does nothing.

    python -m benchmarks.logging_cost [--steps 200000] [--repeats 5] [--log-every 50]

Runs pipeline.training.loop.train_epoch over `--steps` batches with a step that does nothing, alternately
without a tracker and with one (MLflow in a throw-away SQLite store, or the server of $MLFLOW_TRACKING_URI,
plus TensorBoard), `--repeats` times each, and prints the tracked loop's extra time per step: the median
and the min-max over the repeats. The buffered metrics are written inside the timed span. On a GPU a step of
this CNN captured in a CUDA graph is so short (docs/measurements.md) that microseconds per step would show.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pipeline.data.tensors import DeviceData
from pipeline.model.network import LabNet
from pipeline.params.loading import load_params
from pipeline.params.schema import TrackingConfig, TrainConfig
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.tracker import Tracker
from pipeline.training.loop import TrainingResult, Window, train_epoch


def timed_epoch(config: TrainConfig, steps: int, tracker: Tracker | None) -> float:
    """Seconds for one epoch of `steps` do-nothing steps (one sample each), buffered metrics written."""
    data = DeviceData(images=torch.zeros(steps, 1, 1, 1), labels=torch.zeros(steps, dtype=torch.int64))
    window = Window(loss=torch.zeros((), dtype=torch.float64), correct=torch.zeros((), dtype=torch.int64))
    result = TrainingResult(model=LabNet(config.model))
    shuffler = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    train_epoch(lambda images, labels: None, window, data, config, 1, shuffler, result, tracker, progress=False)
    if tracker is not None:
        tracker.flush()
    return time.perf_counter() - started


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000, help="steps per timed epoch")
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs with and without tracking")
    parser.add_argument("--log-every", type=int, default=50, help="train.log_every_steps (params.yaml: 50)")
    args = parser.parse_args(arguments)
    config = dataclasses.replace(load_params().train, batch_size=1, log_every_steps=args.log_every)
    torch.set_num_threads(1)
    costs_us: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{scratch}/mlflow.db")
        store = os.environ["MLFLOW_TRACKING_URI"]
        tracking = TrackingConfig(experiment="logging-cost", tensorboard_dir="runs", registered_model="benchmark")
        with open_tracker("benchmark", tracking, root=Path(scratch)) as tracker:
            timed_epoch(config, min(args.steps, 10_000), tracker)  # warm: imports, first store writes
            for repeat in range(args.repeats):
                bare = timed_epoch(config, args.steps, None)
                tracked = timed_epoch(config, args.steps, tracker)
                costs_us.append(1e6 * (tracked - bare) / args.steps)
                print(
                    f"  repeat {repeat + 1}: {1e6 * bare / args.steps:.2f} µs/step bare, "
                    f"{1e6 * tracked / args.steps:.2f} tracked -> {costs_us[-1]:+.2f} µs/step",
                    flush=True,
                )
    print(
        f"\ntracking costs {statistics.median(costs_us):+.2f} µs per step (min-max {min(costs_us):+.2f} to "
        f"{max(costs_us):+.2f}) over {args.repeats} repeats of {args.steps} steps, a record every {args.log_every} "
        f"steps, store {store.split('://')[0]} (goal: <= 10 µs)."
    )


if __name__ == "__main__":
    main()
