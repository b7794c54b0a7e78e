"""The report's "Memory and energy per step": what each combination's step holds at its peak, by part, with a figure
of memory against batch size, and its energy where the device has a counter (the profile records' `memory` and
`energy`, pipeline.profiling.memory and pipeline.profiling.energy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from pipeline.records.profile import ProfileRecord
from pipeline.records.quantities import MEGABYTE, MEMORY_PARTS, StepMemory
from pipeline.records.wording import energy_sentence
from pipeline.report.figures import save_figure

MEMORY_FIGURE = "figures/memory.png"
# One colour per part, the same in every panel; the state a step starts from in blues, what it makes in warm colours.
PART_COLOURS = dict(
    zip(
        MEMORY_PARTS,
        ("#1f77b4", "#9ecae1", "#6baed6", "#c6dbef", "#ff7f0e", "#d62728", "#9467bd", "#bdbdbd"),
        strict=True,
    )
)


def _measured(profiles: Sequence[ProfileRecord]) -> list[tuple[ProfileRecord, StepMemory]]:
    return [(record, record.memory) for record in profiles if record.memory is not None]


def memory_section(profiles: Sequence[ProfileRecord], figures: Path) -> list[str]:
    """The section's markdown (a table, the figure, energy), the figure written into `figures`."""
    measured = _measured(profiles)
    if not measured:
        return [
            "_No profile record holds memory figures (records from before they were measured); rerun the "
            "profile stages._\n"
        ]
    parts = [name for name in MEMORY_PARTS if any(memory.bytes_of[name] for _, memory in measured)]
    header = " | ".join(parts)
    lines = [
        "What each combination's step holds in the device's memory at its peak, in MB (10^6 bytes): the state it "
        "starts from (weights, optimizer state, the batch, the last step's gradients) and what it allocates on the "
        "way, from the allocator's record of one step in each timing process (the processes' range column gives the "
        "peak's range over them). Parts with nothing in any combination are left out.\n",
        f"| combination | peak MB | processes' range | {header} |",
        f"| --- | ---: | ---: | {' | '.join('---:' for _ in parts)} |",
    ]
    for record, memory in measured:
        cells = " | ".join(f"{memory.bytes_of[name] / MEGABYTE:.3f}" for name in parts)
        spread = f"{memory.peak_low_bytes / MEGABYTE:.3f}-{memory.peak_high_bytes / MEGABYTE:.3f}"
        lines.append(f"| {record.combination.name} | {memory.peak_mb:.3f} | {spread} | {cells} |")
    memory_figure([record for record, _ in measured], figures / Path(MEMORY_FIGURE).name)
    sections = ["\n".join(lines) + "\n", f"![memory at the step's peak by part, against batch size]({MEMORY_FIGURE})\n"]
    sections.append(energy_markdown(profiles))
    return sections


def energy_markdown(profiles: Sequence[ProfileRecord]) -> str:
    """Energy per combination where measured; where no combination of a device has it, why, once for the device."""
    lines = []
    for device in dict.fromkeys(record.combination.device for record in profiles):
        records = [record for record in profiles if record.combination.device == device]
        if not any(record.energy for record in records):
            why = next((record.energy_unavailable for record in records if record.energy_unavailable), "")
            lines.append(f"- Energy on the {device}: {why or 'not measured (records from before it was)'}.")
            continue
        lines += [f"- {record.combination.name}: {energy_sentence(record)}" for record in records]
    return "\n".join(lines) + "\n"


def memory_figure(records: Sequence[ProfileRecord], target: Path) -> None:
    """Stacked bars of the peak by part against batch size, one panel per device and mode."""
    panels = list(dict.fromkeys((record.combination.device, record.combination.mode) for record in records))
    figure, axes_grid = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for axes, (device, mode) in zip(axes_grid[0], panels, strict=True):
        chosen = sorted(
            (r for r in records if (r.combination.device, r.combination.mode) == (device, mode)),
            key=lambda r: r.combination.batch_size,
        )
        labels = [str(r.combination.batch_size) for r in chosen]
        bottom = [0.0] * len(chosen)
        for name in MEMORY_PARTS:
            heights = [r.memory.bytes_of[name] / MEGABYTE if r.memory else 0.0 for r in chosen]
            if any(heights):
                axes.bar(labels, heights, bottom=bottom, color=PART_COLOURS[name], label=name)
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        axes.set_ylim(0, 1.12 * max(bottom, default=0.0) or 1.0)  # room above the tallest bar
        axes.set_xlabel("batch size")
        axes.set_ylabel("MB at the step's peak")
        axes.set_title(f"{device}, {mode}", fontsize=11)
        axes.grid(alpha=0.3, axis="y")
        axes.legend(fontsize=7, loc="upper left")
    save_figure(figure, target)
