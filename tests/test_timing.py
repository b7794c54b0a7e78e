"""Step timing with torch.utils.benchmark.Timer: block length, stopping rule, threads, quiet import."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from pipeline.timing import MIN_BLOCKS, device_clock, time_steps
from tests.conftest import REPO_ROOT

CPU = torch.device("cpu")


def _spin(seconds: float) -> None:
    """Busy-wait: a step of known wall time that stays exact on a loaded machine (unlike sleeping)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_stops_as_soon_as_the_median_is_pinned_down(two_threads: None) -> None:
    threads_seen: set[int] = set()

    def step() -> None:
        threads_seen.add(torch.get_num_threads())
        _spin(200e-6)

    timing = time_steps(step, CPU, batch_size=4, ci_target_pct=2.0, time_budget_s=20.0)
    estimate = timing.estimate
    assert not estimate.noisy and estimate.ci_half_width_pct <= 2.0
    assert timing.seconds < 5.0  # far inside the budget: it stopped on the target
    assert estimate.blocks >= MIN_BLOCKS and len(timing.blocks) == estimate.blocks
    assert estimate.median_ms == pytest.approx(0.2, rel=0.25)
    # Blocks of >= 10 ms: 50 steps of 0.2 ms (Timer alone would have timed 1-step blocks of 0.2 ms).
    assert min(block.seconds for block in timing.blocks) >= 0.0095
    assert timing.steps_per_block >= 48 and estimate.steps == sum(block.steps for block in timing.blocks)
    # The stage's thread setting, not Timer's default of 1; and it is left as it was.
    assert threads_seen == {2} and torch.get_num_threads() == 2
    assert timing.conditions.threads == 2
    assert {"step_time_ms_median", "step_time_ci_pct", "noisy", "machine_busy", "timing_s"} <= set(timing.metrics())


def test_budget_ends_a_measurement_that_cannot_reach_the_target(two_threads: None) -> None:
    rng = random.Random(0)

    def erratic_step() -> None:
        _spin(rng.choice((0.3e-3, 3e-3)))  # a bimodal step: its median is never pinned to 0.01 %

    started = time.perf_counter()
    timing = time_steps(erratic_step, CPU, batch_size=1, ci_target_pct=0.01, time_budget_s=1.5)
    elapsed = time.perf_counter() - started
    assert timing.estimate.noisy and timing.metrics()["noisy"] == 1.0
    assert 1.3 < elapsed < 2.5  # the budget, overshot by at most about one block and Timer's re-sizing
    assert timing.estimate.ci_half_width_pct < 100  # enough blocks for a real interval, just not a tight one


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


def test_importing_the_timer_prints_nothing() -> None:
    """torch.utils.benchmark imports cpp_extension, which logs about CUDA_HOME on toolkit-without-GPU machines."""
    result = subprocess.run(
        [sys.executable, "-c", "import pipeline.timing"],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""
