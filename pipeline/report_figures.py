"""The report's figures (PNG, matplotlib's headless Agg backend)."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: CI and servers

import matplotlib.pyplot as plt

DPI = 110


def read_csv(path: Path) -> list[dict[str, float]]:
    with path.open() as handle:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def training_curves(epochs: Sequence[dict[str, float]], steps: Sequence[dict[str, float]], target: Path) -> None:
    """Loss and accuracy: per logged step (train) and per epoch (train and test)."""
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(10, 3.8))
    steps_per_epoch = max(row["step"] for row in steps) / max(row["epoch"] for row in epochs)
    epoch_x = [row["epoch"] * steps_per_epoch for row in epochs]
    loss_axes.plot(
        [r["step"] for r in steps], [r["train_loss"] for r in steps], label="train (per logged step)", alpha=0.6
    )
    loss_axes.plot(epoch_x, [r["train_loss"] for r in epochs], "o-", label="train (epoch mean)")
    loss_axes.plot(epoch_x, [r["test_loss"] for r in epochs], "s-", label="test")
    loss_axes.set(xlabel="optimizer step", ylabel="NLL loss", title="Loss", yscale="log")
    accuracy_axes.plot(
        [r["step"] for r in steps], [r["train_accuracy"] for r in steps], label="train (per logged step)", alpha=0.6
    )
    accuracy_axes.plot(epoch_x, [r["train_accuracy"] for r in epochs], "o-", label="train (epoch mean)")
    accuracy_axes.plot(epoch_x, [r["test_accuracy"] for r in epochs], "s-", label="test")
    accuracy_axes.set(xlabel="optimizer step", ylabel="accuracy", title="Accuracy")
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=DPI)
    plt.close(figure)


def batch_size_plot(rows: Sequence[Mapping[str, Any]], value: str, label: str, target: Path) -> None:
    """`value` against batch size, one line per device/mode (log-log: costs scale multiplicatively)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        series[str(row["series"])].append((int(row["batch_size"]), float(row[value])))
    figure, axes = plt.subplots(figsize=(6, 4))
    for name, points in sorted(series.items()):
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], "o-", label=name)
    batch_sizes = sorted({int(row["batch_size"]) for row in rows})
    axes.set(xscale="log", yscale="log", xlabel="batch size", ylabel=label, title=f"{label} vs batch size")
    axes.set_xticks(batch_sizes, [str(size) for size in batch_sizes])
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=DPI)
    plt.close(figure)
