"""Each step's energy fitted from a counter polled during the timing (pipeline.profiling.energy_during_timing)."""

from __future__ import annotations

import math
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from pipeline.data.mnist import fetch_mnist, write_dataset
from pipeline.model.checkpoint import checkpoint_payload, save_checkpoint
from pipeline.model.network import LabNet
from pipeline.params.parsing import params_from_mapping
from pipeline.profiling.energy import Unavailable
from pipeline.profiling.energy_during_timing import (
    MIN_INTERVALS_PER_STEP,
    Poller,
    PowerFit,
    Span,
    Update,
    fit_powers,
    poll,
)
from pipeline.profiling.processes import ask, worker_server
from pipeline.profiling.worker import WorkerSpec
from tests.helpers.data import LAB_MODEL
from tests.helpers.projects import REPO_PARAMS


def interleaved_spans(items: int, rounds: int, seed: int, start_s: float = 1.0) -> list[Span]:
    """Rounds of one block of every item in a random order, each block 10-60 ms long, as time_interleaved runs them."""
    draw = random.Random(seed)
    spans, now = [], start_s
    for _ in range(rounds):
        for item in draw.sample(range(items), items):
            length = draw.uniform(0.010, 0.060)
            spans.append(Span(item, now, now + length))
            now += length + 0.0001  # a little bookkeeping between blocks
    return spans


def counter_updates(
    spans: list[Span],
    power_w: list[float],
    period_s: float,
    lag_s: float,
    read_s: float,
    seed: int,
    idle_w: float = 50.0,
) -> list[Update]:
    """What the poller sees of a counter that, at each update (every `period_s`, a little jittered), publishes the
    energy up to `lag_s` before it, the power being each span's item's (`idle_w` outside the spans); each change is
    bracketed by reads of `read_s`, at a phase drawn at random."""
    draw = random.Random(seed)

    def energy_until(t: float) -> float:
        joules, last = 0.0, 0.0
        for span in spans:
            if span.start_s >= t:
                break
            joules += idle_w * (min(span.start_s, t) - last)
            joules += power_w[span.item] * (min(span.end_s, t) - span.start_s)
            last = min(span.end_s, t)
        return joules + idle_w * max(t - last, 0.0)

    updates = [Update(0.0, read_s, 0)]
    update = 0.0
    end = spans[-1].end_s + 3 * period_s
    while update < end:
        update += period_s * draw.uniform(0.98, 1.02)
        offset = draw.uniform(0, read_s)  # where the update fell inside the read that saw it
        updates.append(
            Update(update - offset - read_s, update - offset + read_s, round(1000 * energy_until(update - lag_s)))
        )
    return updates


def expect_fit(result: PowerFit | Unavailable) -> PowerFit:
    assert isinstance(result, PowerFit), result
    return result


@pytest.mark.parametrize("lag_s", [0.0, 0.03, 0.12])
def test_each_steps_power_is_recovered_from_a_counter_that_updates_every_100_ms(lag_s: float) -> None:
    power = [110.0, 125.0, 131.0, 150.0, 162.0, 138.0]
    spans = interleaved_spans(len(power), rounds=60, seed=1)  # ~13 s, as one timing process of six steps
    updates = counter_updates(spans, power, period_s=0.1, lag_s=lag_s, read_s=0.0024, seed=2)
    fit = expect_fit(fit_powers(updates, spans, len(power)))
    assert fit.power_w == pytest.approx(power, rel=0.02)
    assert fit.lag_s == pytest.approx(lag_s, abs=0.011)
    assert fit.update_period_s == pytest.approx(0.1, rel=0.02)
    assert fit.intervals >= 100


def test_steps_of_one_power_are_not_told_apart_by_the_lag() -> None:
    spans = interleaved_spans(3, rounds=40, seed=3)
    fit = expect_fit(fit_powers(counter_updates(spans, [140.0] * 3, 0.1, 0.05, 0.0024, seed=4), spans, 3))
    assert fit.power_w == pytest.approx([140.0] * 3, rel=0.02)


def test_a_timing_too_short_for_the_counter_gives_no_energy_and_says_why() -> None:
    spans = interleaved_spans(6, rounds=3, seed=5)  # ~0.6 s: a handful of updates for six unknowns
    result = fit_powers(counter_updates(spans, [120.0] * 6, 0.1, 0.0, 0.0024, seed=6), spans, 6)
    assert isinstance(result, Unavailable)
    assert f"needs {MIN_INTERVALS_PER_STEP * 6 + 1}" in result.reason and "updates every 100 ms" in result.reason


def test_a_step_that_never_ran_has_no_power() -> None:
    spans = [span for span in interleaved_spans(3, rounds=60, seed=7) if span.item != 2]
    result = fit_powers(counter_updates(spans, [120.0, 130.0, 0.0], 0.1, 0.0, 0.0024, seed=8), spans, 3)
    assert isinstance(result, Unavailable) and "never ran" in result.reason


def test_a_counter_that_smears_power_over_many_updates_does_not_pass_for_a_fit() -> None:
    # Each update publishes the mean power of the last 2 s, not the energy since the last update: the steps' powers
    # are then blurred together, and the fit must not claim them. Either no positive fit, or powers that no longer
    # follow the steps: here the contrast between the steps all but vanishes.
    power = [80.0, 200.0]
    spans = interleaved_spans(2, rounds=120, seed=9)
    exact = counter_updates(spans, power, 0.1, 0.0, 0.0024, seed=10)
    smeared = [exact[0]]
    for index in range(1, len(exact)):
        back = exact[max(0, index - 20)]
        mean_w = (exact[index].millijoules - back.millijoules) / 1000 / max(exact[index].at_s - back.at_s, 1e-9)
        smeared.append(
            Update(exact[index].after_s, exact[index].before_s, smeared[-1].millijoules + round(mean_w * 100))
        )
    result = fit_powers(smeared, spans, 2)
    if isinstance(result, PowerFit):
        assert abs(result.power_w[1] - result.power_w[0]) < 0.5 * (power[1] - power[0])


class RealTimeCounter:
    """A counter on the real clock: the energy at `power_w` up to the last multiple of `period_s` since it started."""

    name = "stand-in"

    def __init__(self, period_s: float, power_w: float) -> None:
        self.started = time.perf_counter()
        self.period_s = period_s
        self.power_w = power_w

    def millijoules(self) -> int:
        updates = math.floor((time.perf_counter() - self.started) / self.period_s)
        return round(updates * self.period_s * self.power_w * 1000)


def test_the_poller_brackets_every_update_it_sees() -> None:
    counter = RealTimeCounter(period_s=0.02, power_w=100.0)
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    updates = poll(counter, stop.is_set, pause_s=0.0)
    assert len(updates) >= 10
    for update in updates[1:]:
        true_at = counter.started + round(update.millijoules / (counter.period_s * counter.power_w * 1000)) * 0.02
        assert update.after_s <= true_at <= update.before_s


def test_a_counter_this_machine_lacks_is_named_by_the_poller_process() -> None:
    poller = Poller("gpu:999")  # no NVIDIA driver here, or no GPU 999 where there is one
    answer = poller.ready()
    assert isinstance(answer, Unavailable) and "NVML" in answer.reason


@pytest.mark.slow  # starts a process that imports torch: seconds, so `make test` only
def test_a_timing_process_whose_counter_cannot_be_read_times_all_the_same_and_says_why(
    tmp_path: Path, mnist_mirror: Path
) -> None:
    write_dataset(fetch_mnist(params_from_mapping(REPO_PARAMS).data, [str(mnist_mirror)]), tmp_path / "data")
    torch.manual_seed(0)
    payload = checkpoint_payload(LabNet(LAB_MODEL), {"lr": 1.0}, "digest", {"device": "cpu"}, {"test_accuracy": 0.1})
    save_checkpoint(payload, tmp_path / "model.pt")
    items = ((1, "inference"), (16, "train"))
    spec = WorkerSpec(
        str(tmp_path / "model.pt"), str(tmp_path / "data"), "cpu", items, 1, 2, 2.0, 0.6, energy="gpu:999"
    )
    with worker_server() as server:
        result = ask(server, spec)
    assert len(result.blocks) == 2 and all(result.blocks)  # timed all the same
    assert len(result.energy) == 2 and all("NVML" in answer["unavailable"] for answer in result.energy)
