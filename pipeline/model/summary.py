"""Per-layer summary of a model: output shape, parameters and FLOPs per sample, plus totals.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode`, which counts the matrix work
(convolutions, matmuls) and counts element-wise ops (ReLU, pooling, dropout) as 0 — the table says so.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class LayerRow:
    layer: str  # dotted module path, e.g. features.conv1
    kind: str  # module class, e.g. Conv2d
    output_shape: str  # per sample, e.g. 32x26x26
    parameters: int
    flops_per_sample: int  # forward pass


@dataclass(frozen=True)
class ModelSummary:
    rows: tuple[LayerRow, ...]
    total_parameters: int
    trainable_parameters: int
    forward_flops_per_sample: int
    training_flops_per_sample: int  # forward + backward, what one training sample costs

    def as_dict(self) -> dict[str, object]:
        return {
            "layers": [asdict(row) for row in self.rows],
            "total_parameters": self.total_parameters,
            "trainable_parameters": self.trainable_parameters,
            "forward_flops_per_sample": self.forward_flops_per_sample,
            "training_flops_per_sample": self.training_flops_per_sample,
        }


def summarize(model: nn.Module, input_shape: tuple[int, ...]) -> ModelSummary:
    """Run one sample through `model` (in eval mode) and collect the table; leaves `model` unchanged."""
    was_training = model.training
    model.eval()
    leaves = {name: module for name, module in model.named_modules() if name and not list(module.children())}
    shapes: dict[str, str] = {}
    order: list[str] = []

    def record(name: str) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def hook(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
            order.append(name)
            shapes[name] = "x".join(str(size) for size in output.shape[1:])

        return hook

    handles = [module.register_forward_hook(record(name)) for name, module in leaves.items()]
    sample = torch.zeros(1, *input_shape)
    try:
        with FlopCounterMode(display=False) as forward_counter, torch.no_grad():
            model(sample)
    finally:
        for handle in handles:
            handle.remove()
    flops_by_module = forward_counter.get_flop_counts()
    root = type(model).__name__
    rows = tuple(
        LayerRow(
            layer=name,
            kind=type(leaves[name]).__name__,
            output_shape=shapes[name],
            parameters=sum(p.numel() for p in leaves[name].parameters()),
            flops_per_sample=int(sum(flops_by_module.get(f"{root}.{name}", {}).values())),
        )
        for name in order
    )
    with FlopCounterMode(display=False) as training_counter:
        model(torch.zeros(1, *input_shape, requires_grad=False)).sum().backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return ModelSummary(
        rows=rows,
        total_parameters=sum(p.numel() for p in model.parameters()),
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        forward_flops_per_sample=forward_counter.get_total_flops(),
        training_flops_per_sample=training_counter.get_total_flops(),
    )


def summary_markdown(summary: ModelSummary) -> str:
    lines = [
        "| layer | type | output shape (per sample) | parameters | forward FLOPs per sample |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for row in summary.rows:
        lines.append(
            f"| {row.layer} | {row.kind} | {row.output_shape} | {row.parameters:,} | {row.flops_per_sample:,} |"
        )
    lines.append(f"| **total** | | | **{summary.total_parameters:,}** | **{summary.forward_flops_per_sample:,}** |")
    lines += [
        "",
        f"Trainable parameters: {summary.trainable_parameters:,}. One training sample (forward + backward) costs "
        f"{summary.training_flops_per_sample:,} FLOPs.",
        "FLOPs counted by torch.utils.flop_counter: convolutions and matrix products; element-wise ops "
        "(ReLU, pooling, dropout, log-softmax) count as 0.",
    ]
    return "\n".join(lines) + "\n"


def summary_csv(summary: ModelSummary) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["layer", "type", "output_shape", "parameters", "flops_per_sample"])
    for row in summary.rows:
        writer.writerow([row.layer, row.kind, row.output_shape, row.parameters, row.flops_per_sample])
    writer.writerow(["total", "", "", summary.total_parameters, summary.forward_flops_per_sample])
    return buffer.getvalue()
