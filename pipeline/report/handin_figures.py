"""The hand-in's figures, one set per language: titles, axes and legends in the hand-in's language where an installed
font draws its characters, and no words but numbers, units and operator names where none does (the caption then says
what each panel and line is: `curves_layout`, `operators_layout` in the catalogues)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib import font_manager

from pipeline.records.profile import ProfileRecord
from pipeline.report.catalogue import Catalogue
from pipeline.report.figures import charmap, save_figure

NAME_CHARACTERS = 40  # a CUDA kernel's name runs to hundreds of characters
# The catalogue's words drawn in the figures: a font must draw all of them for the figures to carry words.
FIGURE_WORDS = ("fig_step", "fig_loss", "fig_accuracy", "fig_train_steps", "fig_train_epochs", "fig_test_epochs")


def curves_path(language: str) -> str:
    return f"figures/handin_curves.{language}.png"


def operators_path(language: str) -> str:
    return f"figures/handin_top_operators.{language}.png"


def figure_font(catalogue: Catalogue, records: Sequence[ProfileRecord] = ()) -> str | None:
    """The font family that draws every word the figures take from `catalogue` (matplotlib's default where it can, else
    the first installed font that can); None where no installed font can."""
    words = "".join(catalogue(key) for key in FIGURE_WORDS) + catalogue("fig_share")
    words += "".join(_panel_title(record, catalogue) for record in records)
    return _font_for(frozenset(ch for ch in words if not ch.isspace()))


def bundled_cjk_font() -> str | None:
    """The Noto Sans CJK collection that requirements.txt installs (package `noto-cjk-sans-otc`, SIL Open Font
    License), so that the Chinese figures carry words on a machine with no CJK font of its own, as fresh Linux
    machines have none; None where the package is missing."""
    try:
        from noto_cjk_sans_otc import FONT_PATH
    except ImportError:
        return None
    path = Path(str(FONT_PATH))
    return str(path) if path.is_file() else None


# Of the collection's faces, the one whose glyph shapes follow the mainland standard the hand-in is written in.
SIMPLIFIED_CHINESE_FACE = "Noto Sans CJK SC"


@functools.cache
def _font_for(characters: frozenset[str]) -> str | None:
    default = font_manager.findfont(font_manager.FontProperties())
    known = {entry.fname for entry in font_manager.fontManager.ttflist}
    bundled = bundled_cjk_font()
    # matplotlib's font list is cached from when it was first built: fonts installed since are only on the system.
    candidates = [
        default,
        *([bundled] if bundled else []),
        *sorted(known),
        *sorted(set(font_manager.findSystemFonts()) - known),
    ]
    for path in candidates:
        if "LastResort" in Path(path).name:  # matplotlib's fallback: a box for every character it "covers"
            continue
        try:
            covered = charmap(path)
        except (OSError, RuntimeError):
            continue
        if all(ord(ch) in covered for ch in characters):
            if path not in known:
                font_manager.fontManager.addfont(path)  # a collection: each of its faces
            faces = {entry.name for entry in font_manager.fontManager.ttflist if entry.fname == path}
            if SIMPLIFIED_CHINESE_FACE in faces:
                return SIMPLIFIED_CHINESE_FACE
            return str(font_manager.FontProperties(fname=path).get_name())
    return None


def curves_figure(
    epochs: Sequence[dict[str, float]], steps: Sequence[dict[str, float]], target: Path, catalogue: Catalogue
) -> None:
    """Loss (log scale) and accuracy against the optimizer step: each logged step's training value, each epoch's
    training mean and each epoch's test value."""
    font = figure_font(catalogue)
    with plt.rc_context({"font.family": font} if font else {}):
        figure, panels = plt.subplots(1, 2, figsize=(9.5, 3.4))
        steps_per_epoch = max(row["step"] for row in steps) / max(row["epoch"] for row in epochs)
        epoch_x = [row["epoch"] * steps_per_epoch for row in epochs]
        for axes, metric in zip(panels, ("loss", "accuracy"), strict=True):
            step_x = [row["step"] for row in steps]
            axes.plot(step_x, [row[f"train_{metric}"] for row in steps], alpha=0.6, label=catalogue("fig_train_steps"))
            axes.plot(epoch_x, [row[f"train_{metric}"] for row in epochs], "o-", label=catalogue("fig_train_epochs"))
            axes.plot(epoch_x, [row[f"test_{metric}"] for row in epochs], "s-", label=catalogue("fig_test_epochs"))
            axes.set(yscale="log" if metric == "loss" else "linear")
            if font:
                axes.set(xlabel=catalogue("fig_step"), ylabel=catalogue(f"fig_{metric}"))
                axes.legend(fontsize=8)
            axes.grid(alpha=0.3)
        save_figure(figure, target)


def operators_figure(records: Sequence[ProfileRecord], target: Path, catalogue: Catalogue) -> None:
    """Each combination's top operators as bars of their share (%), one panel per combination: rows by batch
    size, columns by device and mode (titled in the hand-in's language where a font draws it)."""
    font = figure_font(catalogue, records)
    batches = sorted({record.combination.batch_size for record in records})
    columns = sorted({(record.combination.device, record.combination.mode) for record in records})
    with plt.rc_context({"font.family": font} if font else {}):
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
            axes.set_yticks(range(len(rows)), names, fontsize=7, fontfamily="DejaVu Sans")
            for position, share in enumerate(shares):
                axes.annotate(
                    f"{share:.1f}",
                    (share, position),
                    xytext=(2, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=7,
                )
            axes.set_xlim(0, max(shares, default=1) * 1.18)
            axes.set_xlabel(catalogue("fig_share") if font else "%", fontsize=8)
            if font:
                axes.set_title(_panel_title(record, catalogue), fontsize=9)
            axes.tick_params(axis="x", labelsize=7)
        save_figure(figure, target)


def _panel_title(record: ProfileRecord, catalogue: Catalogue) -> str:
    combination = record.combination
    return catalogue(
        "fig_panel",
        batch=combination.batch_size,
        device=catalogue(f"device_{combination.device}"),
        mode=catalogue(f"mode_{combination.mode}"),
    )


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARACTERS else name[: NAME_CHARACTERS - 1] + "…"
