"""The report's figures (PNG, matplotlib's headless Agg backend)."""

from __future__ import annotations

import csv
import functools
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.image
import matplotlib.pyplot as plt
from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ft2font import FT2Font
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter, NullFormatter

from pipeline.common.errors import PipelineError
from pipeline.devices.registry import device_kind
from pipeline.records.quantities import Interval
from pipeline.report.step_analysis import StepFacts

matplotlib.use("Agg")  # no display: CI and servers

DPI = 110  # every figure of the report and of the machines report
INTERVAL_BARS = "bars: 95 % confidence interval of the median"


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
    save_figure(figure, target)


@dataclass(frozen=True)
class ErrorBars:
    """One plotted line and its 95 % intervals, as matplotlib's `errorbar` takes them: the distances from
    each point down to its interval's low end and up to its high end (asymmetric, so right on log axes)."""

    x: tuple[int, ...]  # batch sizes, ascending
    y: tuple[float, ...]
    below: tuple[float, ...]  # y - low
    above: tuple[float, ...]  # high - y; infinite where the interval bounds nothing above (no bar is drawn)


def error_bars(points: Iterable[tuple[int, Interval]]) -> ErrorBars:
    ordered = sorted(points, key=lambda point: point[0])
    return ErrorBars(
        x=tuple(batch for batch, _ in ordered),
        y=tuple(interval.value for _, interval in ordered),
        below=tuple(interval.value - interval.low for _, interval in ordered),
        above=tuple(interval.high - interval.value for _, interval in ordered),
    )


def batch_size_series(rows: Sequence[Mapping[str, Any]], value: str) -> dict[str, ErrorBars]:
    """`value` and its interval (the `<value>_ci_low` / `_ci_high` columns) per device/mode series."""
    series: dict[str, list[tuple[int, Interval]]] = defaultdict(list)
    for row in rows:
        interval = Interval(float(row[value]), float(row[f"{value}_ci_low"]), float(row[f"{value}_ci_high"]))
        series[str(row["series"])].append((int(row["batch_size"]), interval))
    return {name: error_bars(points) for name, points in sorted(series.items())}


def per_sample_series(facts: Sequence[StepFacts], mode: str) -> dict[str, ErrorBars]:
    """Per-sample time and its interval per device, in one mode."""
    by_device: dict[str, list[tuple[int, Interval]]] = defaultdict(list)
    for fact in facts:
        if fact.mode == mode:
            by_device[fact.device].append((fact.batch_size, fact.per_sample))
    return {device: error_bars(points) for device, points in sorted(by_device.items())}


def flop_rate_series(facts: Sequence[StepFacts]) -> dict[tuple[str, str], ErrorBars]:
    """Achieved GFLOP/s and its interval per device and mode (combinations with a FLOP count only)."""
    series: dict[tuple[str, str], list[tuple[int, Interval]]] = defaultdict(list)
    for fact in facts:
        if (achieved := fact.achieved_gflops_per_s) is not None:
            series[(fact.device, fact.mode)].append((fact.batch_size, achieved))
    return {key: error_bars(points) for key, points in sorted(series.items())}


def batch_size_plot(rows: Sequence[Mapping[str, Any]], value: str, label: str, target: Path) -> None:
    """`value` against batch size, one line per device/mode (log-log: costs scale multiplicatively), each
    point with its 95 % interval."""
    figure, axes = plt.subplots(figsize=(6, 4))
    for name, bars in batch_size_series(rows, value).items():
        _draw(axes, bars, "o-", label=name)
    batch_sizes = sorted({int(row["batch_size"]) for row in rows})
    axes.set(xscale="log", yscale="log", xlabel="batch size", ylabel=label)
    axes.set_title(f"{label} vs batch size\n{INTERVAL_BARS}", fontsize=11)
    axes.set_xticks(batch_sizes, [str(size) for size in batch_sizes])
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    save_figure(figure, target)


MODE_STYLES = {"inference": "o-", "train": "s--"}


def roofline_figure(facts: Sequence[StepFacts], peaks: Mapping[str, float], target: Path) -> None:
    """Achieved GFLOP/s vs batch size, one line per device and mode, each device's measured peak dashed.

    Roofline-style: the distance from a line up to its device's peak is arithmetic the step leaves
    unused (log scale, so a factor of 10 looks the same everywhere).
    """
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for (device, mode), bars in flop_rate_series(facts).items():
        _draw(
            axes,
            bars,
            MODE_STYLES.get(mode, "o-"),
            color=device_kind(device).colour,
            label=f"{device} {mode}",
        )
    for device, peak in sorted(peaks.items()):
        axes.axhline(peak, color=device_kind(device).colour, linestyle=":", linewidth=1.5)
        axes.annotate(
            f"{device} peak {peak:,.0f} GFLOP/s (fp32 matmul)",
            (0.01, peak),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=7,
        )
    _batch_axis(axes, facts)
    _plain_log_y(axes)
    axes.set_ylabel("achieved GFLOP/s")
    axes.set_title(f"Achieved FLOP/s vs batch size (dotted: measured peak)\n{INTERVAL_BARS}", fontsize=11)
    axes.legend(fontsize=8, loc="lower right")
    save_figure(figure, target)


def cpu_vs_gpu_figure(facts: Sequence[StepFacts], target: Path) -> None:
    """Per-sample time vs batch size with both devices, one panel per mode (log-log)."""
    modes = sorted({fact.mode for fact in facts})
    figure, panels = plt.subplots(1, max(1, len(modes)), figsize=(5.2 * max(1, len(modes)), 3.8), squeeze=False)
    for axes, mode in zip(panels[0], modes, strict=False):
        for device, bars in per_sample_series(facts, mode).items():
            _draw(axes, bars, "o-", color=device_kind(device).colour, label=device)
        _batch_axis(axes, [fact for fact in facts if fact.mode == mode])
        _plain_log_y(axes)
        axes.set_ylabel("per-sample time (ms)")
        axes.set_title(f"{mode}: CPU vs GPU\n{INTERVAL_BARS}", fontsize=11)
        axes.legend(fontsize=8)
    save_figure(figure, target)


def _draw(axes: Axes, bars: ErrorBars, style: str, **line: Any) -> None:
    """The line through the medians, each point with its interval: small markers and caps, so a narrow
    interval still shows beside its marker on log axes."""
    axes.errorbar(
        bars.x, bars.y, yerr=(bars.below, bars.above), fmt=style, markersize=4, capsize=3, elinewidth=1, **line
    )


def _batch_axis(axes: Axes, facts: Sequence[StepFacts]) -> None:
    batch_sizes = sorted({fact.batch_size for fact in facts})
    axes.set_xscale("log")
    axes.set_xlabel("batch size")
    if batch_sizes:
        axes.set_xticks(batch_sizes, [str(size) for size in batch_sizes])
    axes.grid(alpha=0.3, which="both")


def _plain_log_y(axes: Axes) -> None:
    """Log y axis labelled 0.01, 1, 100 ... instead of 10^-2 and unlabelled or cluttered minor ticks."""
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
    axes.yaxis.set_minor_formatter(NullFormatter())


def missing_glyphs(figure: Figure) -> dict[str, str]:
    """Font file name -> the characters of the figure's text it has no glyph for. matplotlib draws each of those
    as an empty box and only warns, so a figure with Chinese labels and a Latin-only font looks fine to the code."""
    with warnings.catch_warnings():  # matplotlib's own warning per glyph: this function says it once, in full
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        figure.canvas.draw()
    missing: dict[str, set[str]] = defaultdict(set)
    for text in _texts(figure):
        font = font_manager.findfont(text.get_fontproperties())
        covered = charmap(font)
        missing[Path(font).name].update(ch for ch in text.get_text() if not ch.isspace() and ord(ch) not in covered)
    return {font: "".join(sorted(chars)) for font, chars in sorted(missing.items()) if chars}


def _texts(figure: Figure) -> list[Text]:
    """Every visible text of a drawn figure (titles, labels, tick labels, legends, annotations)."""
    return [text for text in figure.findobj(Text) if text.get_visible() and text.get_text().strip()]


@functools.cache
def charmap(font: str) -> frozenset[int]:
    """The code points the font file `font` has glyphs for."""
    return frozenset(FT2Font(font).get_charmap())


def save_figure(figure: Figure, target: Path) -> None:
    """Lay out, check and write a figure: a character its font cannot draw is an error, not a box in the picture.
    A PNG carries its texts in its `Description` metadata, so a reader can check them without the code.

    The figure is drawn once, at the resolution it is written at: the glyph check's drawing is the PNG's picture,
    written as `savefig` writes it (`FigureCanvasAgg.print_png`: draw, then `image.imsave`), since `savefig` would
    draw all its text again."""
    figure.tight_layout()
    figure.set_dpi(DPI)
    missing = missing_glyphs(figure)
    if missing:
        plt.close(figure)
        listing = "; ".join(f"{font} lacks {chars!r}" for font, chars in missing.items())
        raise PipelineError(
            f"The figure {target.name} has text its font cannot draw ({listing}): matplotlib would draw boxes. "
            "Keep figure text to characters the DejaVu fonts bundled with matplotlib have (numbers, operator names, "
            "units)."
        )
    texts = [text.get_text() for text in _texts(figure)]  # as missing_glyphs drew them: tick labels formatted
    if target.suffix == ".png":
        picture = figure.canvas.buffer_rgba()  # type: ignore[attr-defined]  # the Agg canvas pyplot figures have
        metadata = {"Description": "\n".join(texts)}
        matplotlib.image.imsave(target, picture, format="png", origin="upper", dpi=DPI, metadata=metadata)
    else:
        figure.savefig(target, dpi=DPI)
    plt.close(figure)
