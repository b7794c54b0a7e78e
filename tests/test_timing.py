"""Step timing with torch.utils.benchmark.Timer: block length, stopping rule, threads, quiet import."""

from __future__ import annotations

import ast
import copy
import itertools
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch

from pipeline.model.network import LabNet
from pipeline.profiling.processes import wait_until_ready, worker_server
from pipeline.profiling.timing import MIN_BLOCKS, MIN_ROUNDS, device_clock, time_interleaved, time_steps
from pipeline.profiling.worker import build_step
from pipeline.records.statistics import (
    GRADIENTS,
    SWITCH_WARMUP_S,
    comparison_pairs,
    gradient_items,
    known_well_enough,
)
from tests.helpers.data import LAB_MODEL
from tests.helpers.repo import run_python

CPU = torch.device("cpu")


class VirtualClock:
    """A clock that only steps move: block times are exact whatever else the machine is doing.

    The stopping rule and the block sizing are then tested deterministically; the wall-clock budget
    still runs on real time.
    """

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def step_taking(self, seconds: Callable[[], float]) -> Callable[[], None]:
        def step() -> None:
            self.now += seconds()

        return step


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_stops_as_soon_as_the_median_is_pinned_down(two_threads: None) -> None:
    clock = VirtualClock()
    threads_seen: set[int] = set()
    advance = clock.step_taking(lambda: 200e-6)

    def step() -> None:
        threads_seen.add(torch.get_num_threads())
        advance()

    timing = time_steps(step, CPU, batch_size=4, ci_target_pct=2.0, time_budget_s=20.0, clock=clock)
    estimate = timing.estimate
    assert not estimate.noisy and estimate.ci_half_width_pct == pytest.approx(0.0, abs=1e-6)
    assert timing.seconds < 10.0  # far inside the 20 s budget: it stopped on the target after one round
    assert estimate.blocks >= MIN_BLOCKS and len(timing.blocks) == estimate.blocks
    assert estimate.median_ms == pytest.approx(0.2)
    # Blocks of >= 10 ms: 50 steps of 0.2 ms (Timer alone would have timed 1-step blocks of 0.2 ms).
    assert {block.steps for block in timing.blocks} == {50} and timing.steps_per_block == 50
    assert all(block.seconds == pytest.approx(0.010) for block in timing.blocks)
    assert estimate.steps == 50 * estimate.blocks
    # The stage's thread setting, not Timer's default of 1; and it is left as it was.
    assert threads_seen == {2} and torch.get_num_threads() == 2
    assert timing.conditions.threads == 2
    assert {"step_time_ms_median", "step_time_ci_pct", "noisy", "machine_busy", "timing_s"} <= {
        *timing.record().as_metrics(),
        *timing.conditions.as_metrics(),
    }


def test_interleaved_blocks_time_each_step_warm_after_another_ones_block(two_threads: None) -> None:
    """A short step right after another combination's block starts cold (on a 2-vCPU EPYC a batch-1 inference step
    took 2.3x its warm time, fading over ~2.5 ms). Here a 0.5 ms step costs 1.15 ms first after the other step, 0.7 ms
    second: each block follows SWITCH_WARMUP_S of untimed steps, so every block times it warm, exactly 0.5 ms; the
    8 ms step, longer than twice that, gets none."""
    clock = VirtualClock()
    calls: list[str] = []

    def short() -> None:
        since_switch = next((i for i, name in enumerate(reversed(calls)) if name != "short"), len(calls))
        clock.now += (1.15e-3, 0.7e-3)[since_switch] if since_switch < 2 else 0.5e-3
        calls.append("short")

    def long() -> None:
        clock.now += 8e-3
        calls.append("long")

    timing = time_interleaved([short, long], CPU, 2.0, 5.0, random.Random(1), clock=clock)
    short_blocks, long_blocks = timing.blocks
    assert len(short_blocks) >= MIN_ROUNDS
    assert {round(block.step_ms, 9) for block in short_blocks} == {0.5}
    assert {round(block.step_ms, 9) for block in long_blocks} == {8.0}
    runs = [len(list(group)) for name, group in itertools.groupby(calls) if name == "short"]
    warmup = round(SWITCH_WARMUP_S / 0.5e-3)
    assert warmup == 6 and runs[-1] == warmup + short_blocks[-1].steps  # the last round: warm-up, then the block


def test_blocks_sized_on_a_stalled_probe_are_dropped_and_resized(two_threads: None) -> None:
    """The first steps are 100x slower (another job held the CPUs): 1-step blocks, then the steps speed up."""
    clock = VirtualClock()
    calls = iter(range(10**9))
    step = clock.step_taking(lambda: 0.020 if next(calls) < 6 else 0.0002)
    timing = time_steps(step, CPU, batch_size=1, ci_target_pct=2.0, time_budget_s=20.0, clock=clock)
    assert timing.estimate.median_ms == pytest.approx(0.2) and not timing.estimate.noisy
    # Every kept block was measured after the re-sizing: >= 10 ms, none of the 1-step blocks is left.
    assert all(block.steps >= 50 and block.seconds >= 0.00999 for block in timing.blocks)


def test_budget_ends_a_measurement_that_cannot_reach_the_target(two_threads: None) -> None:
    rng = random.Random(0)
    clock = VirtualClock()
    erratic_step = clock.step_taking(lambda: rng.lognormvariate(-7.0, 0.8))  # ~1 ms, never pinned to 0.01 %
    started = time.perf_counter()
    timing = time_steps(erratic_step, CPU, batch_size=1, ci_target_pct=0.01, time_budget_s=1.5, clock=clock)
    elapsed = time.perf_counter() - started
    assert timing.estimate.noisy and timing.record().as_metrics()["noisy"] == 1.0
    # The wall-clock budget ends it: not before 1.2 s, and not at the 2+ minutes an unreachable target would take
    # (the upper bound is generous for a loaded CI machine).
    assert 1.2 <= elapsed < 15.0
    assert timing.estimate.blocks > MIN_BLOCKS and timing.estimate.ci_half_width_pct < 100


def test_real_steps_are_timed_with_the_real_clock(two_threads: None) -> None:
    """A real tensor step end to end (no virtual clock): many steps per block, blocks of about 10 ms or more.

    Sized from the fastest probe block, a block can come out shorter when the machine speeds up after the
    probe (another job ends), so on a shared machine only the typical block is checked here.
    """
    # An 8-element op: microseconds and never multi-threaded, so even on a loaded 2-core machine (where a
    # threaded matmul's workers wait on preempted peers for milliseconds) many steps fit a block.
    weights = torch.randn(8)
    timing = time_steps(lambda: weights.mul(2), CPU, batch_size=1, ci_target_pct=50.0, time_budget_s=1.0)
    assert timing.steps_per_block > 1
    assert statistics.median(block.seconds for block in timing.blocks) >= 0.005
    assert timing.estimate.median_ms > 0 and timing.estimate.blocks == len(timing.blocks) >= 1


def test_device_clock_waits_for_queued_gpu_work() -> None:
    assert device_clock(CPU)() <= device_clock(CPU)()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    device = torch.device("cuda")
    clock: Callable[[], float] = device_clock(device)
    big = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize(device)
    started = clock()
    for _ in range(20):
        big @ big
    assert clock() - started > 1e-3  # 20 4096^3 matmuls were waited for, not just launched


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_importing_the_timer_prints_nothing() -> None:
    """torch.utils.benchmark imports cpp_extension, which logs about CUDA_HOME on toolkit-without-GPU machines."""
    result = run_python("import pipeline.profiling.timing")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""


# What a timing server imports, then what one step of each mode reaches (pipeline.profiling.worker): an
# inference-only server skips torch._dynamo (1.3-1.5 s) because an inference step never imports it.
_SERVER_THEN_STEP = """
import sys
import torch
from pipeline.model.network import LabNet
from pipeline.profiling.worker import make_step, serve
from tests.helpers.data import LAB_MODEL
serve(training=sys.argv[1] == "train")  # stdin is empty: imports, then no spec
after_server = "torch._dynamo" in sys.modules
images, labels = torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.int64)
step = make_step(LabNet(LAB_MODEL), sys.argv[1], images, labels, 1.0)
for _ in range(3):
    step()
print(after_server, "torch._dynamo" in sys.modules)
"""


@pytest.mark.slow  # starts processes that import torch: seconds, so `make test` only
@pytest.mark.parametrize(("mode", "expected"), [("inference", "False False"), ("train", "True True")])
def test_an_inference_server_and_step_never_import_dynamo_and_a_training_server_imports_it_first(
    mode: str, expected: str
) -> None:
    result = run_python(_SERVER_THEN_STEP, mode)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == expected, result.stdout


# Every `torch.cuda.is_available()` a process makes before it forks timing processes, with the check it used: CUDA's
# driver does not survive a fork once `cudaGetDeviceCount` initialised it; PyTorch's NVML count leaves it alone, but
# starts NVML's own thread, so the server, which forks every timing process, must not ask at all.
_AVAILABILITY_CHECKS = """
import os, runpy, sys
import torch
checks = []
real = torch.cuda.is_available
def spy():
    checks.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
    return real()
torch.cuda.is_available = spy
if sys.argv[1] == "stage":
    import stages.profile  # what the profile stage imports before it forks its server
    import torch._dynamo  # forked_worker_server(training=True) imports it before the fork
    from pipeline.training.runtime import select_device
    select_device("auto", param="profile.devices")  # the stage resolves its device before it forks
else:
    runpy.run_module("pipeline.profiling.worker", run_name="__main__")  # the server afresh; stdin is empty
print(checks)
"""


@pytest.mark.slow  # starts processes that import torch: seconds, so `make test` only
@pytest.mark.parametrize("process", ["stage", "server"])
def test_no_process_that_forks_timing_processes_initialises_cuda_and_a_server_never_asks_for_a_gpu(
    process: str, tmp_path: Path
) -> None:
    environment = {**os.environ, "CUDA_HOME": str(tmp_path)}  # a toolkit found: torch.utils.benchmark then asks
    environment.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    result = run_python(_AVAILABILITY_CHECKS, process, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    checks = ast.literal_eval(result.stdout.splitlines()[-1])
    if process == "stage":
        assert checks and set(checks) == {"1"}, checks  # asked, and every time through NVML
    else:
        assert checks == [], checks


@pytest.mark.slow  # starts a server that imports torch: seconds, so `make test` only
def test_a_started_timing_server_is_handed_over_only_once_its_imports_are_done_and_holds_one_thread() -> None:
    """A timing process must not share the cores with a server still importing torch (seconds of CPU), or the
    first processes time a slower machine than the rest. `worker_server` returns once the server said READY, by
    which time torch is mapped in it. And the server forks every timing process, so it holds no thread pool: on
    this interpreter numpy's OpenBLAS starts one worker per core at import unless told otherwise."""

    def torch_mapped(pid: int) -> bool:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()

    with worker_server(training=True, ready=True) as server:
        assert server.poll() is None and torch_mapped(server.pid)
        assert psutil.Process(server.pid).num_threads() == 1
    with worker_server(training=False, ready=False) as early:
        started = torch_mapped(early.pid)  # a fresh interpreter: torch not loaded yet
        wait_until_ready(early)
        assert not started and torch_mapped(early.pid)


def _scattered(clock: VirtualClock, rng: random.Random, step_s: float, scatter: float) -> Callable[[], None]:
    """A step of `step_s` whose every call takes a log-normal factor of sd `scatter` more or less."""
    return clock.step_taking(lambda: step_s * math.exp(rng.gauss(0.0, scatter)))


@pytest.mark.parametrize(
    ("earlier_spread", "stops_early"),
    [
        pytest.param(0.30, True, id="processes-far-apart-stop-once-their-own-error-is-a-third-of-it"),
        pytest.param(0.002, False, id="processes-alike-time-to-the-budget"),
    ],
)
def test_a_timing_process_stops_once_it_knows_its_values_well_against_the_earlier_processes_spread(
    two_threads: None, earlier_spread: float, stops_early: bool
) -> None:
    """Steps scatter by 25 %, so no process reaches the ±2 % target in its budget. Where the processes before it
    lay 30 % apart (sd of their logs), a process knows its medians and ratios to a third of that after its first
    rounds and stops; where they agreed within 0.2 %, it goes on for as long as its own target asks."""
    clock, rng = VirtualClock(), random.Random(3)
    steps = [_scattered(clock, rng, 0.002, 0.25), _scattered(clock, rng, 0.012, 0.25)]
    items, pairs = ((1, "inference"), (4, "inference")), ((1, 0, 0.25),)
    earlier = [
        tuple(value * math.exp(earlier_spread * z) for value in (2.0, 12.0, 1.5)) for z in (-1.2, -0.4, 0.3, 1.1)
    ]
    assert comparison_pairs(items) == pairs
    timing = time_interleaved(steps, CPU, 2.0, 20.0, random.Random(1), clock=clock, pairs=pairs, earlier=earlier)
    rounds = len(timing.blocks[0])
    if stops_early:
        assert MIN_ROUNDS <= rounds < 60
    else:
        assert rounds > 300


def test_known_well_enough_asks_the_target_until_three_processes_have_finished() -> None:
    """With fewer earlier processes than MIN_SPREAD_PROCESSES their spread sets nothing: the target alone does."""
    rng = random.Random(5)
    rounds = [[2.0 * math.exp(rng.gauss(0.0, 0.08)) for _ in range(30)]]
    far_apart = [(1.0,), (3.0,)]
    assert not known_well_enough(rounds, (), far_apart, 2.0)
    assert known_well_enough(rounds, (), [*far_apart, (2.0,)], 2.0)
    assert known_well_enough([[2.0] * 30], (), [], 2.0)  # no scatter: known to any target


def test_the_gradients_items_are_set_against_their_own_batch_sizes_training_and_inference_steps_only() -> None:
    """A GRADIENTS item joins each batch size profiled in both modes, and is paired only within its batch size: the
    training step over it (the update's factor), it over the inference step (the backward pass's); never another
    batch size's, and never per sample."""
    profiled = ((1, "inference"), (1, "train"), (16, "inference"), (16, "train"), (64, "train"))
    assert gradient_items(profiled) == ((1, GRADIENTS), (16, GRADIENTS))
    items = profiled + gradient_items(profiled)
    pairs = comparison_pairs(items)
    with_gradients = {(items[a], items[b], scale) for a, b, scale in pairs if GRADIENTS in (items[a][1], items[b][1])}
    assert with_gradients == {
        ((1, "train"), (1, GRADIENTS), 1.0),
        ((1, GRADIENTS), (1, "inference"), 1.0),
        ((16, "train"), (16, GRADIENTS), 1.0),
        ((16, GRADIENTS), (16, "inference"), 1.0),
    }
    assert [pair for pair in pairs if GRADIENTS not in (items[pair[0]][1], items[pair[1]][1])] == list(
        comparison_pairs(profiled)
    )


def test_the_gradients_step_computes_the_training_steps_gradients_without_updating_the_weights() -> None:
    torch.manual_seed(0)
    model = LabNet(LAB_MODEL)
    images, labels = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    train_model = copy.deepcopy(model)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    gradients = build_step(model, GRADIENTS, images, labels, lr=1.0)
    assert gradients.optimizer is None  # nothing held for an update: its memory is the training step's minus that
    torch.manual_seed(1)  # the same dropout masks in both steps
    gradients.run()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    train = build_step(train_model, "train", images, labels, lr=1.0)
    torch.manual_seed(1)
    train.run()  # the same gradients, then the update
    for mine, theirs in zip(model.parameters(), train_model.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None and torch.allclose(mine.grad, theirs.grad)
    assert not all(torch.equal(p, b) for p, b in zip(train_model.parameters(), before, strict=True))
