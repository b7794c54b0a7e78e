"""The model's dataflow graph: TensorBoard's graph view, torch.export (.pt2) and ONNX programs.

Both portable programs are exported with a dynamic batch dimension and checked against the
PyTorch model on real images at every batch size in `graph.check_batch_sizes`.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline.common.errors import PipelineError
from pipeline.model.network import LabNet

if TYPE_CHECKING:
    from pipeline.tracking.tracker import Tracker


# Upper bound of the exported batch dimension; any batch from 1 to this runs without re-export.
MAX_EXPORT_BATCH = 65_536
# Exporters trace with this batch: > 1, so the batch dimension is not specialised to a constant.
TRACE_BATCH = 2
# The checkout's folder, as the exporters' source locations spell it (`File "<CHECKOUT>/pipeline/...`).
CHECKOUT = str(Path(__file__).resolve().parents[2]) + "/"
_SOURCE_FILE = re.compile(r'File "([^"]+)"')


def _portable(path: str) -> str:
    _, site_packages, package_path = path.partition("/site-packages/")
    if site_packages:
        return package_path  # torch/nn/modules/conv.py, wherever the environment lives
    return path.removeprefix(CHECKOUT)


def portable_stack_trace(stack_trace: str) -> str:
    """Each source location of a node relative to the checkout or to the installed packages: both programs keep
    where each node comes from (a line of this project or of torch) without the folders this clone and its
    environment happen to be in, so that clones at different paths export the same bytes (DVC's hashes then say
    whether the program changed, not where it was made)."""
    return _SOURCE_FILE.sub(lambda match: f'File "{_portable(match.group(1))}"', stack_trace)


def add_tensorboard_graph(tracker: Tracker, model: LabNet, example: torch.Tensor) -> None:
    """`SummaryWriter.add_graph`, whose tracer (torch.jit.trace) is deprecated.

    The deprecation warnings are expected here and kept out of the user's console; any failure of
    the tracer itself is reported as a clear error, not swallowed.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`torch\.jit\.trace(_method)?` is deprecated", category=FutureWarning
        )
        try:
            tracker.add_graph(model, example)
        except OSError:
            raise  # writing the events failed (a full disk): the stage names the folder, the tracer is not at fault
        except Exception as error:
            raise PipelineError(
                f"TensorBoard graph export failed: torch.jit.trace could not trace {type(model).__name__} "
                f"({type(error).__name__}: {error}). The .pt2 and ONNX exports are the supported graph formats; "
                "report this with the torch version."
            ) from error


def _dynamic_batch() -> dict[str, dict[int, torch.export.Dim]]:
    return {"images": {0: torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)}}


def export_program(model: LabNet, pt2_path: Path) -> torch.export.ExportedProgram:
    """torch.export the model (eval mode) with a dynamic batch and save it as a .pt2 archive."""
    example = torch.zeros(TRACE_BATCH, *model.input_shape)
    program = torch.export.export(model.eval(), (example,), dynamic_shapes=_dynamic_batch())
    for node in program.graph.nodes:
        if node.meta.get("stack_trace"):
            node.meta["stack_trace"] = portable_stack_trace(node.meta["stack_trace"])
    torch.export.save(program, pt2_path)
    return program


def program_text(program: torch.export.ExportedProgram) -> str:
    """The exported ATen graph as readable text: signature, range constraints and the graph code.

    Source-location comments are dropped: the .pt2 keeps them, and here every edit of a model file that moves a
    line would change the text of an unchanged graph.
    """
    code = program.graph_module.print_readable(print_output=False)
    kept = [line for line in code.splitlines() if not line.strip().startswith("# File:")]
    return (
        f"# torch {torch.__version__} torch.export program of LabNet\n"
        f"# inputs: {list(program.graph_signature.user_inputs)}; "
        f"range constraints: {dict(program.range_constraints)}\n\n" + "\n".join(kept) + "\n"
    )


def export_onnx(model: LabNet, onnx_path: Path, opset: int) -> None:
    """ONNX through the torch.export-based exporter, with a dynamic batch; checked with the ONNX checker."""
    import onnx  # lazy: only export_graph needs ONNX

    example = torch.zeros(TRACE_BATCH, *model.input_shape)
    program = torch.onnx.export(
        model.eval(), (example,), dynamo=True, dynamic_shapes=_dynamic_batch(), opset_version=opset, verbose=False
    )
    if program is None:  # only the legacy TorchScript exporter returns nothing
        raise PipelineError("torch.onnx.export(dynamo=True) returned no program; report this with the torch version.")
    for function in (program.model.graph, *program.model.functions.values()):
        for node in function:
            for key, value in node.metadata_props.items():
                if key.endswith("stack_trace"):
                    node.metadata_props[key] = portable_stack_trace(value)
    program.save(str(onnx_path))
    onnx.checker.check_model(str(onnx_path), full_check=True)


@dataclass(frozen=True)
class ParityCheck:
    runtime: str  # what ran the exported program
    batch_size: int
    max_abs_difference: float  # vs the PyTorch model's log-probabilities


def check_exported_program(
    pt2_path: Path, model: LabNet, images: torch.Tensor, batch_sizes: tuple[int, ...]
) -> list[ParityCheck]:
    """Reload the .pt2 archive and compare it with `model` at each batch size."""
    reloaded = torch.export.load(pt2_path).module()
    checks = []
    with torch.no_grad():
        for batch in batch_sizes:
            difference = (reloaded(images[:batch]) - model(images[:batch])).abs().max().item()
            checks.append(ParityCheck("torch.export", batch, difference))
    return checks


def check_onnx(
    onnx_path: Path, model: LabNet, images: torch.Tensor, batch_sizes: tuple[int, ...], atol: float
) -> list[ParityCheck]:
    """Run the ONNX file in ONNX Runtime (a pinned dependency) and compare with `model` at each batch size."""
    import onnxruntime  # lazy: only export_graph needs ONNX Runtime

    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    checks = []
    with torch.no_grad():
        for batch in batch_sizes:
            batch_images = images[:batch]
            (outputs,) = session.run(None, {input_name: batch_images.numpy()})
            difference = float((torch.from_numpy(outputs) - model(batch_images)).abs().max())
            checks.append(ParityCheck("onnxruntime", batch, difference))
    # `not <=`, not `>`: a NaN difference compares false with everything and must fail, not pass.
    worst = max(checks, key=lambda check: check.max_abs_difference if check.max_abs_difference <= atol else math.inf)
    if not worst.max_abs_difference <= atol:
        raise PipelineError(
            f"ONNX Runtime output differs from PyTorch by {worst.max_abs_difference:.3g} at batch size "
            f"{worst.batch_size}, more than `graph.parity_atol` = {atol:g}. Check the exporter and opset "
            "(`graph.onnx_opset`), or raise the tolerance in params.yaml if the difference is acceptable."
        )
    return checks
