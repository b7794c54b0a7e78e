"""Training speed: this pipeline's loop vs the pytorch/examples MNIST recipe, in the same run.

    python -m benchmarks.train_speed [--samples 60000] [--repeats 1]

Both train the same network (pipeline.model.LabNet) with the same optimizer and schedule for one
epoch over the first `--samples` training images, with the same thread count, then evaluate on the
full test set. The reference feeds batches the way pytorch/examples mnist/main.py does
(torchvision dataset, ToTensor + Normalize per item, DataLoader with shuffle). The pipeline's loop
runs twice more to measure what tracking costs: without a tracker, and with MLflow + TensorBoard
logging into a throw-away store. Needs `dvc repro download` (or MNIST in data/) first.
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
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms

from pipeline.config import TrackingConfig, load_params
from pipeline.data import load_split
from pipeline.model import LabNet
from pipeline.paths import DATA_ROOT
from pipeline.runtime import pin_runtime, select_precision
from pipeline.tracking import open_tracker
from pipeline.training import MNIST_MEAN, MNIST_STD, evaluate, first_samples, to_device_data, train_model

CPU = torch.device("cpu")


def reference_epoch(model_config, samples: int, seed: int) -> tuple[float, float]:
    """pytorch/examples mnist: returns (images per second, test accuracy)."""
    torch.manual_seed(seed)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
    train_set = Subset(datasets.MNIST(str(DATA_ROOT), train=True, download=False, transform=transform), range(samples))
    test_set = datasets.MNIST(str(DATA_ROOT), train=False, download=False, transform=transform)
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=1000)
    model = LabNet(model_config)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model.train()
    started = time.perf_counter()
    for batch_index, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_index % 10 == 0:
            loss.item()  # the example prints the loss every 10 batches: keep its sync
    seconds = time.perf_counter() - started
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            correct += (model(data).argmax(dim=1) == target).sum().item()
    return samples / seconds, correct / len(test_set)


def pipeline_epoch(train_config, samples: int, precision: str, tracked: bool, seed: int) -> tuple[float, float]:
    """This pipeline's loop, one epoch; returns (images per second, test accuracy)."""
    config = dataclasses.replace(train_config, epochs=1, train_samples=samples, seed=seed)
    pin_runtime(CPU, precision, config.threads, config.seed)
    train = to_device_data(*first_samples(*load_split(DATA_ROOT, "train"), samples), CPU)
    test = to_device_data(*load_split(DATA_ROOT, "test"), CPU)
    if not tracked:
        result = train_model(config, train, test, CPU, precision, tracker=None, progress=False)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{scratch}/mlflow.db"
            tracking = TrackingConfig(experiment="benchmark", tensorboard_dir=f"{scratch}/runs")
            with open_tracker("benchmark", tracking, root=Path(scratch)) as tracker:
                result = train_model(config, train, test, CPU, precision, tracker=tracker, progress=False)
            del os.environ["MLFLOW_TRACKING_URI"]
    _, accuracy = evaluate(result.model, test, config.test_batch_size)
    return result.images_per_second, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=60_000, help="training images per epoch (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, seeds train.seed + 0, 1, ...; medians are reported")
    args = parser.parse_args()
    train_config = load_params().train
    precision = select_precision(train_config.precision, CPU)
    threads = pin_runtime(CPU, precision, train_config.threads, train_config.seed).threads
    print(
        f"torch {torch.__version__}, {threads} CPU thread(s), {args.samples} images, {args.repeats} repeat(s), "
        f"train.precision={train_config.precision} -> {precision}"
    )
    variants = {
        "reference": lambda seed: reference_epoch(train_config.model, args.samples, seed),
        "pipeline fp32": lambda seed: pipeline_epoch(train_config, args.samples, "fp32", tracked=False, seed=seed),
        "pipeline": lambda seed: pipeline_epoch(train_config, args.samples, precision, tracked=False, seed=seed),
        "pipeline+tracking": lambda seed: pipeline_epoch(train_config, args.samples, precision, tracked=True, seed=seed),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        # A new seed per repeat: one epoch's accuracy moves by a few 0.01 % with the seed, so a
        # single seed cannot say which recipe is more accurate. Interleaved, so a slow period of a
        # shared machine hits every variant alike.
        for name, variant in variants.items():
            results[name].append(variant(train_config.seed + repeat))
        ratio = results["pipeline"][-1][0] / results["reference"][-1][0]
        print(f"  repeat {repeat + 1}: " + ", ".join(f"{name} {runs[-1][0]:.0f} img/s" for name, runs in results.items()) + f" -> {ratio:.2f}x")

    speed = {name: statistics.median(run[0] for run in runs) for name, runs in results.items()}
    accuracy = {name: statistics.median(run[1] for run in runs) for name, runs in results.items()}
    print(f"\n{'variant':<20} {'images/s':>10} {'test acc':>9} {'acc min-max':>15}")
    for name, runs in results.items():
        accuracies = [run[1] for run in runs]
        print(f"{name:<20} {speed[name]:>10.0f} {accuracy[name]:>9.4f} {min(accuracies):>7.4f}-{max(accuracies):.4f}")
    print(f"\nspeed-up vs reference: {speed['pipeline'] / speed['reference']:.2f}x (goal >= 2.5x); "
          f"fp32 only: {speed['pipeline fp32'] / speed['reference']:.2f}x")
    overhead = (speed["pipeline"] / speed["pipeline+tracking"] - 1) * 100
    print(f"tracking overhead (MLflow + TensorBoard on vs off): {overhead:+.1f} % (goal <= 3 %)")


if __name__ == "__main__":
    main()
