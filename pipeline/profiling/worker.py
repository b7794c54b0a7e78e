"""The timing processes of a profile stage: the unit the stage repeats (pipeline.profiling.processes).

    python -m pipeline.profiling.worker [--inference-only]   # the server afresh: specs in, one JSON line out
                                                             # each (the profile stage forks the same server)

A fresh process has its own heap, page placement, oneDNN kernel choices and thread pool: two processes running
the same step can settle at different speeds while the blocks inside one process agree closely
(docs/timing.md). So the step times come from several processes, and their uncertainty from the spread between
them. Inside each process every combination of the device is timed interleaved, round by round in a random
order, so that the ratios between combinations are measured paired.

Starting Python with torch takes seconds on a small VM (torch, then torch._dynamo, which the optimizer step and
the checkpoint's loader reach), more than the timing itself. So one server per stage imports everything and runs
no tensor code (no thread pool, no allocation by torch), then forks one child per spec read from stdin: the
profile stage forks the server from itself before its own tensor code
(pipeline.profiling.processes.forked_worker_server); a caller that has run tensor code starts this module. Each
child is a new process from that clean state: it tunes the allocator as every torch stage does (or keeps glibc's
defaults where the spec asks, for the allocator what-if), builds each step from the checkpoint and the first test
images, warms them up, times them (pipeline.profiling.timing) for its share of the budget, measures what the spec
asks after the timing (memory, page faults, energy) and exits; the server prints it all as one JSON line.
Children share the server's library layout and hash seed; a new stage run has a new server, and the calibration
test (tests/test_timing_calibration.py) checks that intervals hold across stage runs.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import signal
import statistics
import sys
import time
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
from pipeline.devices.counters import Unavailable
from pipeline.model.checkpoint import load_checkpoint
from pipeline.params.schema import ProfileConfig
from pipeline.profiling.energy_during_timing import Poller, Span, Update, fit_powers
from pipeline.profiling.memory import BuiltStep, measure_step_memory
from pipeline.profiling.timing import InterleavedTiming, synchronizer, time_interleaved
from pipeline.records.profile import profile_matrix
from pipeline.records.statistics import GRADIENTS, comparison_pairs, gradient_items
from pipeline.training.steps import inference_step


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker measures, and how (all of it from params.yaml, the checkpoint and the stage).

    Every item (a batch size and mode on `device`) is timed in the same process, interleaved: each round times one
    block of every item, in an order drawn afresh from `seed`, so that whatever the machine does in a given second
    it does to all items alike, and their ratios are measured paired (pipeline.records.statistics.paired_ratio).
    """

    checkpoint: str
    data_root: str
    device: str
    items: tuple[tuple[int, str], ...]  # (batch size, mode) pairs
    threads: int  # torch intra-op threads; 0 = torch's default
    warmup_steps: int
    ci_target_pct: float
    budget_s: float  # wall time for the timing itself, after the warm-up (all items together)
    seed: int = 0  # draws each round's order
    tune_allocator: bool = True  # False: glibc malloc's defaults, as a fresh program has them (the allocator what-if)
    energy: str = ""  # the energy counter polled during the timing (pipeline.devices.counters.open_counter); "": none
    memory: bool = True  # measure each item's memory after the timing (pipeline.profiling.memory)
    page_faults: bool = False  # give each item's minor page faults per step, counted around its timed blocks
    # What each process before this one contributed (pipeline.records.statistics.process_values): their spread sets
    # how well this one must know its own values before it stops (known_well_enough).
    earlier: tuple[tuple[float, ...], ...] = ()

    @classmethod
    def for_device(cls, config: ProfileConfig, device: str, checkpoint: Path, data_root: Path) -> WorkerSpec:
        """Every batch size x mode of `config` on `device`, and the GRADIENTS items, as the profile stage times them:
        its threads, warm-up, target and `time_budget_s` per item."""
        profiled = tuple((combination.batch_size, combination.mode) for combination in profile_matrix(config, device))
        items = profiled + gradient_items(profiled)
        return cls(
            checkpoint=str(checkpoint.resolve()),
            data_root=str(data_root.resolve()),
            device=device,
            items=items,
            threads=config.threads,
            warmup_steps=config.warmup_steps,
            ci_target_pct=config.ci_target_pct,
            budget_s=config.time_budget_s * len(items),
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        raw = json.loads(text)
        return cls(
            **{
                **raw,
                "items": tuple((int(batch), str(mode)) for batch, mode in raw["items"]),
                "earlier": tuple(tuple(float(value) for value in values) for values in raw.get("earlier", ())),
            }
        )

    def items_phrase(self) -> str:
        """`batch 1 and 16 (cpu, inference and train)`: the items, for a message."""
        batches = ", ".join(dict.fromkeys(str(batch) for batch, _ in self.items))
        modes = " and ".join(dict.fromkeys(mode for _, mode in self.items))
        return f"batch {batches} ({self.device}, {modes})"


def build_step(model: nn.Module, mode: str, images: torch.Tensor, labels: torch.Tensor, lr: float) -> BuiltStep:
    """One inference forward (eval, no autograd), one training step (forward, backward, Adadelta at `lr`) or, for
    GRADIENTS, the training step without its update, with the tensors it holds between steps."""
    if mode == "inference":
        return BuiltStep(inference_step(model, images), model, (images,), None)
    model.train()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)  # the lab's optimizer: its update is profiled too
    update = mode != GRADIENTS

    def training_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.nll_loss(model(images), labels).backward()  # type: ignore[no-untyped-call]
        if update:
            optimizer.step()

    return BuiltStep(training_step, model, (images, labels), optimizer if update else None)


def make_step(model: nn.Module, mode: str, images: torch.Tensor, labels: torch.Tensor, lr: float) -> Callable[[], None]:
    """`build_step`'s step alone."""
    return build_step(model, mode, images, labels, lr).run


def build_items(spec: WorkerSpec) -> list[BuiltStep]:
    """The step of every item of `spec`, built in this process on `spec.threads` threads (each on its own copy of the
    model, fed the first test images) and warmed up."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    checkpoint = load_checkpoint(Path(spec.checkpoint))
    test_images, test_labels = load_split(Path(spec.data_root), "test")
    lr = float(checkpoint.train_params["lr"])
    built = []
    for batch_size, mode in spec.items:
        model = copy.deepcopy(checkpoint.model).to(device).to(memory_format=MEMORY_FORMAT)
        images = normalize_images(test_images[:batch_size], device).contiguous(memory_format=MEMORY_FORMAT)
        labels = torch.from_numpy(test_labels[:batch_size].astype("int64")).to(device)
        built.append(build_step(model, mode, images, labels, lr))
    for step in built:
        for _ in range(spec.warmup_steps):
            step.run()
    return built


def measure(spec: WorkerSpec) -> dict[str, Any]:
    """Build the step of every item of `spec` in this process and time them interleaved: the blocks of each item, in
    round order, as plain JSON values."""
    started = time.time()
    device = torch.device(spec.device)
    poller = Poller(spec.energy) if spec.energy else None  # started first: its start overlaps the steps' building
    built = build_items(spec)
    steps = [step.run for step in built]
    counter = poller.ready() if poller else None  # the counter's name, or why it cannot be read
    timing = time_interleaved(
        steps,
        device,
        spec.ci_target_pct,
        spec.budget_s,
        random.Random(spec.seed),
        pairs=comparison_pairs(spec.items),
        earlier=spec.earlier,
    )
    energy: list[dict[str, Any]] = []
    if poller and isinstance(counter, str):
        energy = step_energies(poller.stop(), timing, counter)
    elif isinstance(counter, Unavailable):
        energy = [{"unavailable": counter.reason} for _ in steps]
    sync = synchronizer(device)
    faults = list(timing.page_faults) if spec.page_faults else []
    # After the timing, as the memory measure profiles two steps; a GRADIENTS item (only ever timed) has none.
    memory = (
        [
            measure_step_memory(step, device, sync)
            for step, (_, mode) in zip(built, spec.items, strict=True)
            if mode != GRADIENTS
        ]
        if spec.memory
        else []
    )
    return {
        "items": [[[block.steps, block.seconds] for block in blocks] for blocks in timing.blocks],
        "seconds": timing.seconds,
        "conditions": dataclasses.asdict(timing.conditions),
        "memory": [dataclasses.asdict(found) for found in memory],
        "page_faults": faults,
        "energy": energy,
        "window": [started, time.time()],  # wall clock: which processes ran side by side
    }


def step_energies(updates: list[Update] | Unavailable, timing: InterleavedTiming, counter: str) -> list[dict[str, Any]]:
    """Each step's energy, from the counter's updates polled during `timing` (pipeline.profiling.energy_during_timing):
    its fitted power times its median step time here; per step, its figures, or why there are none."""
    items = len(timing.blocks)
    spans = [Span(*span) for span in timing.spans]
    fit = updates if isinstance(updates, Unavailable) else fit_powers(updates, spans, items)
    if isinstance(fit, Unavailable):
        return [{"unavailable": fit.reason} for _ in range(items)]
    return [
        {
            "joules_per_step": power * statistics.median(block.seconds / block.steps for block in blocks),
            "mean_power_w": power,
            "windows": fit.intervals,
            "update_period_s": fit.update_period_s,
            "counter": counter,
        }
        for power, blocks in zip(fit.power_w, timing.blocks, strict=True)
    ]


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


# The line a server started as a program writes once its imports are done: its starter waits for it, so that no
# timing process shares the cores with a server still importing torch.
READY = "ready"


def serve(
    training: bool = True, specs: TextIO | None = None, answers: TextIO | None = None, announce: bool = False
) -> None:
    """Read one spec per line (from `specs`, else stdin); answer each with a line of JSON (to `answers`, else
    stdout) measured in a freshly forked child. `training`: some spec will time a training step, whose optimizer
    reaches torch._dynamo (seconds to import): imported once here, not per child. An inference step never
    imports it, so a server for inference only skips it. `announce`: write READY first, once imported."""
    if training:
        import torch._dynamo  # noqa: F401

    specs, answers = specs or sys.stdin, answers or sys.stdout
    if announce:
        answers.write(READY + "\n")
        answers.flush()
    for line in specs:
        spec = WorkerSpec.from_json(line)
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
        serve(training="--inference-only" not in sys.argv[1:], announce=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
