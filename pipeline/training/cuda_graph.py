"""Steps captured once in a CUDA graph and replayed: the host launches a whole step in one call.

Why: an eager step of the lab CNN launches ~60 small kernels, and a fast GPU sits idle for most of every step
(kernel time a small fraction of the step span): the host's launches, not the GPU's arithmetic, set the pace.
A replayed graph launches all of them at once.

What a captured step must respect (PyTorch docs, "CUDA Graphs"):
- The graph replays fixed device addresses: inputs go through static buffers that each call copies
  into; everything the step allocates during capture lives in a graph-private memory pool that stays
  reserved for its replays.
- Work that must not be replayed (lazy state: optimizer moments, cuBLAS/cuDNN workspaces, autograd's
  stream bookkeeping) happens before capture, in a few eager warm-up steps on a side stream.
- No host sync inside the step (`.item()`, a float lr read back): an optimizer must be
  `capturable=True`, and a learning rate that changes between epochs must be a device tensor the
  graph reads (`GraphLearningRate`).
- Autocast's weight-cast cache must be off while capturing (`cache_enabled=False`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from pipeline.devices.registry import kind_of
from pipeline.training.steps import inference_step

# Eager steps per input shape before capture: the PyTorch docs' whole-network example uses 3.
WARMUP_STEPS = 3

ShapeKey = tuple[tuple[int, ...], ...]


class ShapeGraphs:
    """Run `step(*inputs)`: eagerly the first `warmup_steps` times an input shape is seen, then by replaying
    a graph captured for that shape once, with the inputs copied into the graph's static buffers.

    Every call is a real step: the warm-up calls do the same work as a replay, only slower, so a caller
    that trains batch by batch trains every batch exactly once. A shape seen rarely (an epoch's last,
    smaller batch) simply stays eager until it has been seen `warmup_steps` times; each shape gets its
    own graph and memory pool.
    """

    def __init__(self, step: Callable[..., object], warmup_steps: int = WARMUP_STEPS) -> None:
        self._step = step
        self._warmup_steps = warmup_steps
        self._seen: Counter[ShapeKey] = Counter()
        self._graphs: dict[ShapeKey, tuple[tuple[torch.Tensor, ...], Callable[[], None]]] = {}
        self._stream: torch.cuda.Stream | None = None

    @property
    def captured_shapes(self) -> list[ShapeKey]:
        return list(self._graphs)

    def __call__(self, *inputs: torch.Tensor) -> bool:
        """One step on `inputs`; True if it was a graph replay, False if it ran eagerly."""
        key = tuple(tuple(tensor.shape) for tensor in inputs)
        entry = self._graphs.get(key)
        if entry is None:
            if self._seen[key] < self._warmup_steps:
                self._seen[key] += 1
                self._run_eagerly(inputs)
                return False
            entry = self._graphs[key] = self._capture(inputs)
        buffers, replay = entry
        for buffer, tensor in zip(buffers, inputs, strict=True):
            buffer.copy_(tensor)
        replay()
        return True

    def _side_stream(self) -> torch.cuda.Stream:
        # Warm-up and capture share one side stream, so the cuBLAS/cuDNN workspaces that the capture
        # uses exist before it starts.
        if self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        return self._stream

    def _run_eagerly(self, inputs: tuple[torch.Tensor, ...]) -> None:
        current, side = torch.cuda.current_stream(), self._side_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._step(*inputs)
        current.wait_stream(side)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        # Allocated before capture (ordinary pool), in the layout of the batches copied into them.
        buffers = tuple(tensor.clone() for tensor in inputs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self._side_stream()):
            self._step(*buffers)
        return buffers, graph.replay  # the bound method keeps the graph (and its memory pool) alive


class GraphLearningRate:
    """The learning rate of a captured optimizer step: a device tensor the graph reads at every replay.

    The optimizer's param group keeps its Python float, so schedulers (StepLR) and the recorded lr work
    as in eager training; `capturing()` puts the tensor in the group while a step is captured, and
    `refresh()` copies the group's current float into it before replays.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        (self._group,) = optimizer.param_groups  # one group: a tensor per group otherwise
        self._value = float(self._group["lr"])
        self.tensor = torch.tensor(self._value, dtype=torch.float32, device=device)

    def refresh(self) -> None:
        value = float(self._group["lr"])
        if value != self._value:  # a fill per change (once an epoch), not per step
            self.tensor.fill_(value)
            self._value = value

    @contextmanager
    def capturing(self) -> Iterator[None]:
        if not kind_of(self.tensor.device).graph_capture() or not torch.cuda.is_current_stream_capturing():
            yield  # eager steps use the float, as a non-captured optimizer would
            return
        value = self._group["lr"]
        self._group["lr"] = self.tensor
        try:
            yield
        finally:
            self._group["lr"] = value


def capturable_adadelta(model: torch.nn.Module, lr: float) -> torch.optim.Adadelta:
    """The lab's optimizer with its state on the device and no host sync in `step()`.

    foreach=True: the single-tensor path would read a tensor lr back to the host (a sync, which a
    capture refuses); the multi-tensor path multiplies by it on the device.
    """
    return torch.optim.Adadelta(model.parameters(), lr=lr, capturable=True, foreach=True)


def make_graphable_step(
    model: torch.nn.Module, mode: str, images: torch.Tensor, labels: torch.Tensor, lr: float
) -> Callable[[], None]:
    """The profile stage's step (pipeline.profiling.make_step) in a form that can be captured: the same
    forward, loss, backward and Adadelta update, with a capturable optimizer reading a device lr."""
    if mode == "inference":
        return inference_step(model, images)  # nothing to make capturable: no optimizer state
    model.train()
    optimizer = capturable_adadelta(model, lr)
    graph_lr = GraphLearningRate(optimizer, images.device)

    def training_step() -> None:
        with graph_lr.capturing():
            optimizer.zero_grad(set_to_none=True)
            F.nll_loss(model(images), labels).backward()  # type: ignore[no-untyped-call]
            optimizer.step()

    return training_step


def time_graph_replays(step: Callable[[], None], warmup_steps: int, active_steps: int) -> tuple[float, ...]:
    """Milliseconds per replay of `step` captured once, each from replay to device sync on the host clock.

    The same clock as the profile stage's eager timing (host wall time around step + sync), so
    `eager - graph` per step is the host's share of an eager step: launches, Python, dispatcher.
    `step` closes over its own inputs and must be capturable (see `make_graphable_step`).
    """
    graphs = ShapeGraphs(step, warmup_steps=max(warmup_steps, 1))
    for _ in range(max(warmup_steps, 1) + warmup_steps):  # eager warm-up, capture, then warm replays
        graphs()
    torch.cuda.synchronize()
    times = []
    for _ in range(active_steps):
        started = time.perf_counter()
        graphs()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return tuple(times)
