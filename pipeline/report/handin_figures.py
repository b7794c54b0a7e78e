"""The hand-in's figures. Their text is the same in every language: numbers, units, the data's own column names
and operator names, which the fonts bundled with matplotlib draw on any machine (no CJK font needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from pipeline.profiling.record import ProfileRecord
from pipeline.report.figures import save_figure

CURVES_FIGURE = "figures/handin_curves.png"
OPERATORS_FIGURE = "figures/handin_top_operators.png"
NAME_CHARACTERS = 40  # a CUDA kernel's name runs to hundreds of characters


def curves_figure(epochs: Sequence[dict[str, float]], steps: Sequence[dict[str, float]], target: Path) -> None:
    """Loss (log scale) and accuracy against the optimizer step, labelled with the columns of
    plots/train_steps.csv and plots/train_epochs.csv they plot."""
    figure, panels = plt.subplots(1, 2, figsize=(9.5, 3.4))
    steps_per_epoch = max(row["step"] for row in steps) / max(row["epoch"] for row in epochs)
    epoch_x = [row["epoch"] * steps_per_epoch for row in epochs]
    for axes, metric in zip(panels, ("loss", "accuracy"), strict=True):
        step_x = [row["step"] for row in steps]
        axes.plot(step_x, [row[f"train_{metric}"] for row in steps], alpha=0.6, label=f"train_{metric} (train_steps)")
        axes.plot(epoch_x, [row[f"train_{metric}"] for row in epochs], "o-", label=f"train_{metric} (train_epochs)")
        axes.plot(epoch_x, [row[f"test_{metric}"] for row in epochs], "s-", label=f"test_{metric} (train_epochs)")
        axes.set(xlabel="step", ylabel=metric, yscale="log" if metric == "loss" else "linear")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    save_figure(figure, target)


def operators_figure(records: Sequence[ProfileRecord], target: Path) -> None:
    """Each combination's top operators as bars of their share (%), one panel per combination: rows by batch
    size, columns by device and mode, panels titled with the combination's name."""
    batches = sorted({record.combination.batch_size for record in records})
    columns = sorted({(record.combination.device, record.combination.mode) for record in records})
    figure, panels = plt.subplots(
        len(batches), len(columns), figsize=(5.0 * len(columns), 2.9 * len(batches)), squeeze=False
    )
    for axes in panels.flat:
        axes.set_visible(False)
    for record in records:
        combination = record.combination
        axes = panels[batches.index(combination.batch_size)][columns.index((combination.device, combination.mode))]
        axes.set_visible(True)
        rows = list(reversed(record.top_operators))  # largest at the top
        names = [_short(row.operator) for row in rows]
        shares = [row.share_pct for row in rows]
        axes.barh(range(len(rows)), shares, color="tab:blue")
        axes.set_yticks(range(len(rows)), names, fontsize=7)
        for position, share in enumerate(shares):
            axes.annotate(
                f"{share:.1f}", (share, position), xytext=(2, 0), textcoords="offset points", va="center", fontsize=7
            )
        axes.set_xlim(0, max(shares, default=1) * 1.18)
        axes.set_xlabel("%", fontsize=8)
        axes.set_title(combination.name, fontsize=9)
        axes.tick_params(axis="x", labelsize=7)
    save_figure(figure, target)


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARACTERS else name[: NAME_CHARACTERS - 1] + "…"
