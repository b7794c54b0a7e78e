"""The timing processes of a profile combination: the unit the stage repeats (pipeline.profiling.processes).

    python -m pipeline.profiling.worker [--inference-only]   # the server afresh: specs in, one JSON line out
                                                             # each (the profile stage forks the same server)

A fresh process has its own heap, page placement, oneDNN kernel choices and thread pool, and two processes
running the same step settle at speeds up to 60 % apart on a 2-core VM (issue 21), while the blocks inside
one process agree to ±2 %. So each combination is timed in several processes, and the uncertainty the stage
states comes from the spread between them.

Starting Python with torch costs 4-10 s on a 2-core VM (torch, then torch._dynamo, which the optimizer step and
the checkpoint's loader reach), more than the timing itself. So one server per stage imports everything and runs
no tensor code (no thread pool, no allocation by torch), then forks one child per spec read from stdin: the
profile stage forks the server from itself before its own tensor code
(pipeline.profiling.processes.forked_worker_server); a caller that has run tensor code starts this module. Each
child is a new process from that clean state: it tunes the allocator as every torch stage does, builds the step
from the checkpoint and the first test images, warms it up, times it (pipeline.profiling.timing) for its share of
the budget and exits; the server prints its blocks as one JSON line. Children share the server's library layout
and hash seed; a new stage run has a new server, and the calibration test (tests/test_timing_calibration.py)
checks that intervals hold across stage runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.common.allocator import tune_allocator
from pipeline.common.errors import PipelineError
from pipeline.data.mnist import load_split
from pipeline.data.tensors import MEMORY_FORMAT, normalize_images
from pipeline.model.checkpoint import load_checkpoint
from pipeline.profiling.timing import time_steps
from pipeline.training.steps import inference_step


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker measures, and how (all of it from params.yaml, the checkpoint and the stage)."""

    checkpoint: str
    data_root: str
    batch_size: int
    device: str
    mode: str
    threads: int  # torch intra-op threads; 0 = torch's default
    warmup_steps: int
    ci_target_pct: float
    budget_s: float  # wall time for the timing itself, after the warm-up
    tune_allocator: bool = True

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def make_step(model: nn.Module, mode: str, images: torch.Tensor, labels: torch.Tensor, lr: float) -> Callable[[], None]:
    """One inference forward (eval, no autograd) or one training step (forward, backward, Adadelta at `lr`)."""
    if mode == "inference":
        return inference_step(model, images)
    model.train()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)  # the lab's optimizer: its update is profiled too

    def training_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.nll_loss(model(images), labels).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return training_step


def measure(spec: WorkerSpec) -> dict[str, Any]:
    """Build the step of `spec` in this process, warm it up and time it: the blocks, as plain JSON values."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    checkpoint = load_checkpoint(Path(spec.checkpoint))
    model = checkpoint.model.to(device).to(memory_format=MEMORY_FORMAT)
    test_images, test_labels = load_split(Path(spec.data_root), "test")
    images = normalize_images(test_images[: spec.batch_size], device).contiguous(memory_format=MEMORY_FORMAT)
    labels = torch.from_numpy(test_labels[: spec.batch_size].astype("int64")).to(device)
    step = make_step(model, spec.mode, images, labels, float(checkpoint.train_params["lr"]))
    for _ in range(spec.warmup_steps):
        step()
    timing = time_steps(step, device, spec.batch_size, spec.ci_target_pct, spec.budget_s)
    return {
        "blocks": [[block.steps, block.seconds] for block in timing.blocks],
        "steps_per_block": timing.steps_per_block,
        "seconds": timing.seconds,
        "conditions": dataclasses.asdict(timing.conditions),
    }


def _child(spec: WorkerSpec, output: int) -> None:
    """In the forked child: measure, write the JSON answer (or the error) to `output`, and leave at once."""
    code = 0
    answer: dict[str, Any]
    try:
        if spec.tune_allocator:
            tune_allocator()  # before any tensor: pipeline.common.allocator says why
        answer = {"timing": measure(spec)}
    except KeyboardInterrupt:
        os._exit(130)
    except PipelineError as error:  # e.g. the checkpoint changed since the stage loaded it: the user's fix, no trace
        answer, code = {"user_error": str(error)}, 1
    except BaseException:
        answer, code = {"error": traceback.format_exc()[-3000:]}, 1
    with os.fdopen(output, "w") as stream:
        stream.write(json.dumps(answer))
    os._exit(code)  # no atexit handlers, no buffers of the server flushed twice


def serve(training: bool = True, specs: TextIO | None = None, answers: TextIO | None = None) -> None:
    """Read one spec per line (from `specs`, else stdin); answer each with a line of JSON (to `answers`, else
    stdout) measured in a freshly forked child. `training`: some spec will time a training step, whose optimizer
    reaches torch._dynamo (1.3-1.5 s to import): imported once here, not per child. An inference step never
    imports it, so a server for inference only skips it."""
    if training:
        import torch._dynamo  # noqa: F401

    specs, answers = specs or sys.stdin, answers or sys.stdout
    for line in specs:
        spec = WorkerSpec(**json.loads(line))
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(spec, write_end)
        os.close(write_end)
        with os.fdopen(read_end) as stream:
            answer = stream.read()
        _, status = os.waitpid(pid, 0)
        if not answer:
            answer = json.dumps({"error": f"the timing process ended without an answer (wait status {status})"})
        answers.write(answer + "\n")
        answers.flush()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        serve(training="--inference-only" not in sys.argv[1:])
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
