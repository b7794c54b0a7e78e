"""Every benchmark the README names runs, as a tiny smoke run in a reproduced project copy: a benchmark that
rots is a broken promise. They measure nothing here (samples and budgets far too small to mean anything);
they check that each one runs to its table and that the table holds what it says."""

from __future__ import annotations

import json
import math
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.projects import clone_project, read_params, run_command, stage_environment, write_params
from tests.helpers.repo import REPO_ROOT
from tests.helpers.servers import closed_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, reproduced_project: Path) -> Path:
    """A project copy after `dvc repro` with the tiny params: data/MNIST and models/model.pt in place."""
    return clone_project(reproduced_project, tmp_path_factory.mktemp("benchmarks") / "project")


def test_train_speed_times_every_variant_in_fresh_processes_and_prints_its_table(
    trained: Path, mnist_mirror: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.train_speed",
        "--samples",
        "256",
        "--test-samples",
        "500",
        "--repeats",
        "1",
        "--epochs",
        "2",  # the steady-state path: images/s over epoch 2, the stage's read back from its MLflow store
    ]
    result = run_command(command, trained, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "256 images x 2 epoch(s), images/s over epochs 2-2 (the first pays one-off costs)" in result.stdout
    rows = {
        match["name"]: match
        for match in re.finditer(
            r"^\| (?P<name>[^|]+?) \| (?P<speed>[\d.]+) \((?P<low>[\d.]+)-(?P<high>[\d.]+)\) \| (?P<ratio>[\d.]+)x "
            r"\([\d.]+-[\d.]+x\) \| (?P<accuracy>0\.\d{4}) ",
            result.stdout,
            re.MULTILINE,
        )
    }
    # The tiny params train in fp32 on any CPU only if `auto` resolves so; either way these four are there.
    assert {"reference", "pipeline", "pipeline+tracking", "train stage"} <= set(rows), result.stdout
    for row in rows.values():
        assert 0 < float(row["low"]) <= float(row["speed"]) <= float(row["high"])
        assert 0.0 < float(row["accuracy"]) <= 1.0
    assert rows["reference"]["ratio"] == "1.00"  # each paired with itself
    assert result.stdout.count("repeat ") == 1
    assert re.search(r"pipeline vs reference: [\d.]+x \(min-max [\d.]+-[\d.]+x over 1 paired repeats\)", result.stdout)
    assert re.search(r"tracking costs [+-][\d.]+ % of the loop's time", result.stdout)


def test_train_speed_runs_only_the_named_variants_and_states_what_tracking_costs(
    trained: Path, mnist_mirror: Path
) -> None:
    benchmark = [sys.executable, "-m", "benchmarks.train_speed"]
    refused = run_command([*benchmark, "--variant", "cuda_graph bf16"], trained, stage_environment(mnist_mirror))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "argument --variant: 'cuda_graph bf16' is not a variant on this device; choose from 'reference'" in (
        refused.stderr
    )
    command = [*benchmark, "--samples", "128", "--test-samples", "100", "--repeats", "1"]
    command += ["--variant", "pipeline", "--variant", "pipeline+tracking"]
    result = run_command(command, trained, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 repeat(s) of 2 variants" in result.stdout
    assert "| variant | images/s median (min-max) | vs pipeline: median (min-max) |" in result.stdout
    names = re.findall(r"^\| (pipeline[^|]*?) \| [\d.]+ \(", result.stdout, re.MULTILINE)
    assert names == ["pipeline", "pipeline+tracking"], result.stdout  # no reference, no train stage
    assert "vs reference" not in result.stdout
    kept = re.search(
        r"the tracked loop trains at ([\d.]+) % of the untracked one's images/s \(min-max ([\d.]+)-([\d.]+) %\)",
        result.stdout,
    )
    assert kept and float(kept[2]) <= float(kept[1]) <= float(kept[3]), result.stdout


@pytest.mark.parametrize("epochs", ["0", "101", "two"])
def test_train_speed_refuses_a_number_of_epochs_it_cannot_run(trained: Path, mnist_mirror: Path, epochs: str) -> None:
    result = run_command(
        [sys.executable, "-m", "benchmarks.train_speed", "--epochs", epochs], trained, stage_environment(mnist_mirror)
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"argument --epochs: '{epochs}' is not a number of epochs from 1 to 100" in result.stderr


def test_allocator_benchmark_runs_every_variant_in_its_own_environment(trained: Path, mnist_mirror: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.allocator",
        "--samples",
        "128",
        "--test-samples",
        "500",
        "--repeats",
        "1",
    ]
    result = run_command(command, trained, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(
        re.findall(
            r"^\| ([^|]+?) \| [\d.]+ \([\d.]+-[\d.]+\) \| [\d.]+x \([\d.]+-[\d.]+x\) \| (0\.\d{4}) \(",
            result.stdout,
            re.MULTILINE,
        )
    )
    assert {"glibc defaults", "mallopt (the stages)", "THP (THP_MEM_ALLOC_ENABLE=1)"} <= set(rows), result.stdout
    # An allocator moves bytes, not arithmetic: the same seed trains the same model under every one of them.
    assert len(set(rows.values())) == 1, rows
    faults = dict(re.findall(r"^\| ([^|]+?) \|.*\| ([\d.]+) \([\d.]+-[\d.]+\) \|$", result.stdout, re.MULTILINE))
    assert float(faults["mallopt (the stages)"]) < float(faults["glibc defaults"]), faults
    assert re.search(r"mallopt \(the stages\) vs glibc defaults: [\d.]+x", result.stdout)


def test_profile_stability_times_the_device_as_the_stage_does_and_checks_the_ratios_across_runs(
    trained: Path, mnist_mirror: Path
) -> None:
    params = read_params(trained)
    params["profile"].update(batch_sizes=[1, 16], modes=["inference"], time_budget_s=0.5, processes=2)
    write_params(trained, params)
    command = [sys.executable, "-m", "benchmarks.profile_stability", "--repeats", "2", "--goal-pct", "1000"]
    result = run_command(command, trained, stage_environment(mnist_mirror))
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    for name in ("1-cpu-inference", "16-cpu-inference"):
        for run in (1, 2):  # each run: its estimate, interval and the 2 processes' medians
            line = rf"^  run {run} {name}: [\d.]+ ms \[[\d.]+, [\d.]+\] ±[\d.]+ % from 2 processes \([\d.]+, [\d.]+\)"
            assert len(re.findall(line, result.stdout, re.M)) == 1, result.stdout
        assert re.search(
            rf"^\| {name} \| [\d.]+ \(±[\d.]+\) \| [\d.]+ \(±[\d.]+\) \| [\d.]+ \| agree \|", result.stdout, re.M
        )
    # The one ratio of this matrix, per sample, paired, in both runs, and whether run 2 lies inside run 1's interval.
    ratio = re.search(
        r"^\| 16-cpu-inference / 1-cpu-inference \| ([\d.]+) \(([\d.]+)-([\d.]+)\) \| [\d.]+ \([\d.]+-[\d.]+\) \| "
        r"(yes|no) \| (\d) of 1 \|$",
        result.stdout,
        re.M,
    )
    assert ratio and float(ratio[2]) <= float(ratio[1]) <= float(ratio[3]) and 0 < float(ratio[1]) < 1, result.stdout
    summary = re.search(
        r"Later runs' ratios inside the first run's 95 % CI: (\d) of 1 \(\d+%; goal 90%; intervals from 2 processes "
        r"hold a rerun's ratio (\d+)% of the time with no shift between runs, simulated\)",
        result.stdout,
    )
    assert summary and summary[1] == ratio[5] and 80 <= int(summary[2]) <= 99, result.stdout
    assert result.returncode == (0 if summary[1] == "1" else 1)  # fewer than 90 % inside fails the run
    assert "2 of 2 combinations agree or lie inside each other's intervals" in result.stdout
    refused = run_command([*command[:3], "--repeats", "1"], trained, stage_environment(mnist_mirror))
    assert refused.returncode == 2 and "invalid choice: 1" in refused.stderr


def test_logging_cost_times_the_loop_with_and_without_tracking(tmp_path: Path, mnist_mirror: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.logging_cost", "--steps", "2000", "--repeats", "2"]
    environment = stage_environment(mnist_mirror, {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    result = run_command(command, REPO_ROOT, environment)
    assert result.returncode == 0, result.stderr[-3000:]
    repeats = re.findall(r"repeat \d: ([\d.]+) µs/step bare, ([\d.]+) tracked -> ([+-][\d.]+) µs/step", result.stdout)
    assert len(repeats) == 2 and all(float(bare) > 0 and float(tracked) > 0 for bare, tracked, _ in repeats)
    assert re.search(r"tracking costs [+-][\d.]+ µs per step \(min-max .*\) over 2 repeats of 2000", result.stdout)
    # Its runs went to the store it was given, with every step's metrics flushed into it.
    with sqlite3.connect(tmp_path / "mlflow.db") as store:
        logged = store.execute("SELECT COUNT(*) FROM metrics WHERE key = 'train/loss'").fetchone()[0]
    assert logged == 3 * (2000 // 50)  # a warm-up epoch and two timed ones, a record every 50 steps


def test_stability_verdicts_and_pair_counts_from_known_estimates() -> None:
    from benchmarks.profile_stability import pairs_inside, verdict
    from pipeline.records.quantities import StepEstimate

    def estimate(low: float, median: float, high: float) -> StepEstimate:
        return StepEstimate(4, median, 1.0, low, high, steps=60, blocks=12, ci_target_pct=2.0, processes=6)

    a, b, c = estimate(9.0, 10.0, 11.0), estimate(9.5, 10.6, 12.0), estimate(10.5, 11.5, 12.5)
    assert pairs_inside([a, b, c]) == (4, 6)  # b in a; a and c in b; b in c; c not in a, a not in c
    assert verdict([a, b], 5.0) == ("inside", pytest.approx(6.0))
    assert verdict([a, c], 5.0)[0] == "MISS"
    assert verdict([a, estimate(9.6, 10.4, 11.0)], 5.0)[0] == "agree"


@pytest.mark.parametrize("processes", [3, 6, 8, 9])
def test_the_expected_share_of_a_rerun_inside_matches_a_simulation_written_apart(processes: int) -> None:
    """The benchmark's expectation (pure Python, the report's own interval function) against numpy: the interval of
    the median taken as order statistics (6+ processes: the narrowest pair with binomial coverage of at least 95 %)
    or Student's t on the logarithms (fewer), and a rerun's median of as many processes."""
    import numpy as np
    from scipy import stats

    from benchmarks.profile_stability import expected_inside_share

    rng, trials = np.random.default_rng(7), 100_000
    first, rerun = rng.standard_normal((trials, processes)), np.median(rng.standard_normal((trials, processes)), 1)
    if processes >= 6:
        j = max(k for k in range(1, processes // 2 + 1) if 2 * stats.binom.cdf(k - 1, processes, 0.5) <= 0.05)
        ordered = np.sort(first, 1)
        low, high = ordered[:, j - 1], ordered[:, processes - j]
    else:
        centre, spread = first.mean(1), first.std(1, ddof=1) * stats.t.ppf(0.975, processes - 1) / np.sqrt(processes)
        median = np.median(first, 1)  # the interval is widened to hold the median
        low, high = np.minimum(centre - spread, median), np.maximum(centre + spread, median)
    independent = float(((low <= rerun) & (rerun <= high)).mean())
    assert expected_inside_share(processes) == pytest.approx(independent, abs=0.012)
    assert expected_inside_share(1) is None  # one process: its interval comes from its rounds, not modelled here


def test_class_server_load_benchmark_runs_clients_and_prints_its_table() -> None:
    """SQLite only here (PostgreSQL refuses the root account CI runs as; tests/test_class_server.py runs it)."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.class_server_load",
        "--clients",
        "2",
        "--seconds",
        "2",
        "--workers",
        "2",
    ]
    result = run_command([*command, "--backends", "sqlite", "--port", str(closed_port())], REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    row = re.search(
        r"^\| sqlite \| (?P<runs>\d+) \| (?P<finished>\d+) \| 0 \| (?P<sent>\d+) \| (?P<stored>\d+) \| 0 \| "
        r"0 of (?P<requests>\d+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| (?P<memory>\d+) \|$",
        result.stdout,
        re.MULTILINE,
    )
    assert row, result.stdout
    assert int(row["runs"]) == int(row["finished"]) >= 2 and int(row["sent"]) == int(row["stored"]) > 0
    assert int(row["requests"]) >= 5 * int(row["runs"]) and int(row["memory"]) > 50


def test_switch_cost_shows_each_step_after_a_switch_against_steady_and_the_stages_warm_up(
    trained: Path, mnist_mirror: Path
) -> None:
    params = read_params(trained)
    params["profile"].update(batch_sizes=[1, 16], modes=["inference"])
    write_params(trained, params)
    command = [sys.executable, "-m", "benchmarks.switch_cost", "--seconds", "1", "--steps", "12"]
    result = run_command(command, trained, stage_environment(mnist_mirror))
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("machine: ") and "device cpu" in result.stdout
    number = r"[\d.]+"
    rows = {}
    for name in ("1-cpu-inference", "16-cpu-inference"):
        row = re.search(
            rf"^\| {name} \| ({number}) \| ((?:{number} \| ){{8}})±({number}) % \| (\d+) steps?, {number} ms \| "
            rf"(\d+) steps? \| ({number}) \|$",
            result.stdout,
            re.M,
        )
        assert row, result.stdout
        steady, ratios, warm_within, cold = float(row[1]), row[2].split(" | ")[:8], float(row[3]), int(row[4])
        warmup, first_timed = int(row[5]), row[6]
        assert warm_within >= 2.0  # --tolerance-pct, or the steady steps' own noise where that is more
        assert steady > 0 and all(float(ratio) > 0 for ratio in ratios) and 0 <= cold <= 12
        # The stage's warm-up for this step: about 3 ms of it (the steady time is printed rounded), so the shorter
        # step gets more steps; the first timed step is the one after them.
        assert abs(warmup - 3.0 / steady) <= 0.51
        assert warmup >= len(ratios) or first_timed == ratios[warmup]
        rows[name] = (float(first_timed), warmup, warm_within)
    assert rows["1-cpu-inference"][1] >= rows["16-cpu-inference"][1]
    uncovered = [name for name, (first, _, within) in rows.items() if first > 1 + within / 100]
    assert result.returncode == (1 if uncovered else 0)
    assert ("leaves a cold start in" in result.stdout) == bool(uncovered), result.stdout
    refused = run_command([*command[:3], "--seconds", "0"], trained, stage_environment(mnist_mirror))
    assert refused.returncode == 2 and "--seconds must be above 0" in refused.stderr


def test_switch_cost_counts_the_cold_start_until_a_step_is_warm() -> None:
    from benchmarks.switch_cost import cold_start, positions_over_steady

    runs = [
        [2.0e-3, 1.2e-3, 1.01e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3],
        [2.4e-3, 1.4e-3, 1.0e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3],
    ]
    steady, ratios, noise = positions_over_steady(runs)
    assert steady == pytest.approx(1e-3) and ratios[:3] == pytest.approx([2.2, 1.3, 1.005]) and noise == 0.0
    assert cold_start(ratios, steady, 0.02) == (2, pytest.approx(3.5e-3))  # two cold steps: 2.2 + 1.3 ms
    assert cold_start([1.0, 1.0], steady, 0.02) == (0, 0.0)


def test_stopping_rule_replays_the_rule_on_saved_blocks_and_keeps_fewer_rounds_where_processes_differ(
    tmp_path: Path,
) -> None:
    """`benchmarks.stopping_rule` on blocks as `profile_stability --save` writes them: processes far apart (30 %)
    whose rounds agree within 2 % let the rule stop early; the table says how many rounds it kept against all."""
    from benchmarks.stopping_rule import replay

    rng = random.Random(2)
    items = [[1, "inference"], [4, "inference"]]

    def process(speed: float, twist: float) -> list[list[float]]:
        """One process: its speed shared by both items, and the second item's own factor (its ratio moves too)."""
        return [[base * speed * math.exp(rng.gauss(0.0, 0.02)) for _ in range(40)] for base in (2.0, 6.0 * twist)]

    repeats = [
        [process(math.exp(rng.gauss(0.0, 0.3)), math.exp(rng.gauss(0.0, 0.3))) for _ in range(6)] for _ in range(2)
    ]
    saved = tmp_path / "runs.json"
    saved.write_text(json.dumps({"items": items, "machine": {}, "repeats": repeats}))
    kept, ratio_half, step_half, inside = replay(repeats, [(1, "inference"), (4, "inference")], 2.0, 1 / 3, 12)
    everything = replay(repeats, [(1, "inference"), (4, "inference")], 2.0, None, 12)
    assert everything[0] == 1.0 and kept < 0.5
    assert ratio_half > 0 and step_half > 0 and 0 <= inside <= 1
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.stopping_rule", str(saved), "--min-rounds", "12", "--shares", "0.33"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "| - | all | 100% |" in result.stdout and "| 12 | 0.33 |" in result.stdout
