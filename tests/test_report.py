"""Report stage: analysis from numbers (in process), then `dvc repro report` read back and cross-checked."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml
from matplotlib.axes import Axes
from mlflow import MlflowClient
from PIL import Image

from pipeline.common.tables import rows_csv
from pipeline.params.parsing import params_from_mapping
from pipeline.records.profile import PairedComparison
from pipeline.records.roofs import SpeedDrift
from pipeline.report.comparison import (
    COMPARISON_PLOT_FIELDS,
    comparison_markdown,
    comparison_rows,
    comparisons_table,
)
from pipeline.report.figures import (
    ErrorBars,
    batch_size_plot,
    batch_size_series,
    flop_rate_series,
    per_sample_series,
)
from pipeline.report.lab_report import (
    SECTIONS,
    ReportContext,
    ReportInputs,
    Section,
    build_report,
    read_inputs,
    render_sections,
    section_reference,
)
from pipeline.report.step_analysis import step_facts, step_sentences
from pipeline.tracking.store import ui_url
from tests.helpers.handin import TEMPLATE_HEADINGS, TEMPLATE_LABELS, UNFILLED, header, headings, numbers, tables
from tests.helpers.projects import clone_project, read_params, write_params
from tests.helpers.records import make_comparisons, make_record, write_two_profiles
from tests.helpers.repo import REPO_ROOT, run_python
from tests.helpers.report_sections import report_section


def test_analysis_states_dominant_operators_and_gpu_speedup() -> None:
    conv_backward = ("aten::convolution_backward", 10.0)
    records = [
        make_record(1, "cpu", "train", 6.0, (("aten::add", 20.0), conv_backward)),
        make_record(64, "cpu", "train", 38.4, (("aten::convolution_backward", 30.0), conv_backward)),
        make_record(64, "cuda", "train", 3.84, (("aten::cudnn_convolution", 40.0), conv_backward), busy_pct=14.3),
    ]
    rows = comparison_rows(records)
    assert rows[1].convolution_share_pct == 40.0  # both conv rows of the top-k
    table = comparison_markdown(rows).splitlines()
    assert "| 64 | cpu | train |" in table[3] and "| `aten::convolution_backward` (30.0 %) | 40.0 % |" in table[3]
    speedup = "At batch 64 train cuda is 10.0x faster than cpu (95 % CI 9.61-10.41x; 3.840 vs 38.400 ms per step)."
    assert speedup in step_sentences(step_facts(records))
    assert not any(s.startswith("No GPU was profiled") for s in step_sentences(step_facts(records)))
    assert "On cuda train at batch 64 the GPU is busy 14 % of the traced steps' time: host-bound." in step_sentences(
        step_facts(records)
    )


def test_overlapping_device_intervals_read_no_measurable_difference() -> None:
    records = [
        make_record(1, "cpu", "inference", 0.50, (("aten::addmm", 20.0),), ci_pct=3.0),
        make_record(1, "cuda", "inference", 0.49, (("aten::addmm", 20.0),), ci_pct=2.0),
    ]
    same = (
        "At batch 1 inference cuda vs cpu: 1.02x; the data cannot tell them apart (0.97-1.07x) (0.490 vs 0.500 ms "
        "per step)."
    )
    assert same in step_sentences(step_facts(records))


def test_comparison_rows_carry_the_per_sample_and_throughput_intervals() -> None:
    (row,) = comparison_rows([make_record(16, "cpu", "train", 16.0, ci_pct=2.0)])  # 15.68-16.32 ms per step
    assert (row.per_sample_ms, row.per_sample_ms_ci_low, row.per_sample_ms_ci_high) == pytest.approx((1.0, 0.98, 1.02))
    # A rate inverts the time: its low end comes from the step's high end.
    assert row.throughput_samples_per_s == pytest.approx(1000.0)
    assert row.throughput_samples_per_s_ci_low == pytest.approx(16_000 / 16.32)
    assert row.throughput_samples_per_s_ci_high == pytest.approx(16_000 / 15.68)
    header, line = rows_csv(COMPARISON_PLOT_FIELDS, [dataclasses.asdict(row)]).splitlines()
    cells = dict(zip(header.split(","), line.split(","), strict=True))
    assert cells["per_sample_ms_ci_low"] == "0.98" and cells["per_sample_ms_ci_high"] == "1.02"
    assert cells["throughput_samples_per_s_ci_low"] == "980.392"
    assert cells["throughput_samples_per_s_ci_high"] == "1020.41"


def test_figures_draw_each_point_with_its_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [
        make_record(64, "cpu", "inference", 8.0, ci_pct=5.0),  # listed first: the series are sorted by batch
        make_record(1, "cpu", "inference", 0.5, ci_pct=2.0),
    ]
    rows = [dataclasses.asdict(row) for row in comparison_rows(records)]
    per_sample = batch_size_series(rows, "per_sample_ms")["cpu inference"]
    assert per_sample.x == (1, 64)
    assert per_sample.y == pytest.approx((0.5, 0.125))
    assert per_sample.below == pytest.approx((0.01, 0.00625)) and per_sample.above == pytest.approx((0.01, 0.00625))
    throughput = batch_size_series(rows, "throughput_samples_per_s")["cpu inference"]
    assert throughput.below == pytest.approx((2000 - 2000 / 1.02, 8000 - 8000 / 1.05))
    assert throughput.above == pytest.approx((2000 / 0.98 - 2000, 8000 / 0.95 - 8000))
    facts = step_facts(records)
    assert per_sample_series(facts, "inference")["cpu"] == per_sample
    # 1 MFLOP per sample: 64 MFLOP in 8 ms ±5 % is 8 GFLOP/s, from 8 / 1.05 to 8 / 0.95.
    rate = flop_rate_series(facts)[("cpu", "inference")]
    assert rate.y == pytest.approx((2.0, 8.0))
    assert rate.below[1] == pytest.approx(8 - 8 / 1.05) and rate.above[1] == pytest.approx(8 / 0.95 - 8)

    drawn: list[ErrorBars] = []
    errorbar = Axes.errorbar

    def recording(axes: Axes, x: Any, y: Any, yerr: Any = None, **style: Any) -> Any:
        drawn.append(ErrorBars(tuple(x), tuple(y), *(tuple(side) for side in yerr)))
        return errorbar(axes, x, y, yerr=yerr, **style)

    monkeypatch.setattr(Axes, "errorbar", recording)
    batch_size_plot(rows, "per_sample_ms", "per-sample time (ms)", tmp_path / "per_sample_time.png")
    assert drawn == [per_sample]
    assert (tmp_path / "per_sample_time.png").stat().st_size > 0


def test_batch_scaling_plot_templates_draw_the_interval_columns_of_their_y() -> None:
    """Each batch-scaling plot's template draws its y as a line and, as error bars, the CSV's interval columns
    of that same y (written into the template: DVC's documented anchors stand for whole values)."""
    plots = {
        name: definition
        for entry in yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["plots"]
        for name, definition in entry.items()
        if "batch_scaling" in definition.get("template", "")
    }
    assert set(plots) == {"Per-sample time vs batch size", "Throughput vs batch size"}
    for name, definition in plots.items():
        (y,) = definition["y"].values()
        template = json.loads((REPO_ROOT / definition["template"]).read_text())
        line, bars = template["layer"]
        assert line["encoding"]["y"]["field"] == "<DVC_METRIC_Y>" and line["mark"]["type"] == "line", name
        assert bars["mark"]["type"] == "errorbar", name
        assert (bars["encoding"]["y"]["field"], bars["encoding"]["y2"]["field"]) == (f"{y}_ci_low", f"{y}_ci_high")
        assert {y, f"{y}_ci_low", f"{y}_ci_high"} <= set(COMPARISON_PLOT_FIELDS), name
        # `dvc plots diff` tells revisions apart by these, and the slow tests read them at the top level.
        assert (
            template["encoding"]["color"]["field"] == "series" and template["encoding"]["strokeDash"]["field"] == "rev"
        )
        # One channel for the revision, so one "revision" legend (a `shape` on it too would draw a second one),
        # and that legend draws dashes, not the line's points.
        encodings = [template["encoding"], *(layer["encoding"] for layer in template["layer"])]
        on_rev = [channel for encoding in encodings for channel, spec in encoding.items() if spec.get("field") == "rev"]
        assert on_rev == ["strokeDash"], name
        legend = template["encoding"]["strokeDash"]["legend"]
        # Vega draws no stroke symbol without a transparent fill (seen in Chromium): both are needed for the dashes.
        assert (legend["symbolType"], legend["symbolFillColor"]) == ("stroke", "transparent"), name


def test_the_paired_ratios_table_shows_the_training_step_s_parts_after_its_ratios() -> None:
    ratios = make_comparisons("cpu", {("1-cpu-train", "1-cpu-inference"): (14.2, 13.0, 16.3, (14.2,) * 6)})
    parts = (
        PairedComparison("1-cpu-train", "1-cpu-gradients", "step", 2.61, 2.53, 2.83, (2.61,) * 6),
        PairedComparison("1-cpu-gradients", "1-cpu-inference", "step", 5.26, 4.97, 5.87, (5.26,) * 6),
    )
    lines = comparisons_table([dataclasses.replace(ratios, parts=parts)]).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| 1-cpu-train / 1-cpu-inference",
        "| 1-cpu-train / 1-cpu-gradients",
        "| 1-cpu-gradients / 1-cpu-inference",
    ]
    assert "| 1-cpu-train / 1-cpu-gradients | step |" in lines[3] and "above 1 in all 6 processes" in lines[3]
    assert len(comparisons_table([ratios]).splitlines()) == 3  # an older record: its ratios only


def test_comparison_table_shows_the_estimate_and_flags_noisy_and_busy_rows() -> None:
    rows = comparison_rows(
        [
            make_record(1, "cpu", "inference", 0.5, (("aten::addmm", 20.0),)),
            make_record(64, "cpu", "inference", 8.0, (("aten::max_pool2d", 30.0),), ci_pct=4.5, load=2.6),
        ]
    )
    table = comparison_markdown(rows)
    assert "| step ms (median) | IQR ms | 95 % CI ms | steps / blocks | per-sample ms | samples/s |" in table
    quiet_row = (
        "| 1 | cpu | inference | 0.500 | 0.050 | 0.490–0.510 | 400 / 100 | 0.5000 | 2000 | `aten::addmm` (20.0 %) | "
        "0.0 % |"
    )
    assert quiet_row + "  |" in table  # an empty flag cell
    assert "| 64 | cpu | inference | 8.000 | 0.800 | 7.640–8.360 | 400 / 100 | 0.1250 | 8000 |" in table
    assert table.splitlines()[3].endswith("| processes disagree, busy |")
    assert (
        "**Processes disagree** (64-cpu-inference ±4.5 %): beyond the speed all combinations shared in each timing "
        "process, these rows' processes still spread this wide, more than `profile.ci_target_pct` (±2 %); raise"
    ) in table
    assert "**Busy machine**: the load average exceeded the 2 cores while timing" in table
    assert "while timing 64-cpu-inference (2.60 -> 2.60); those step times may be slower and less stable" in table
    quiet = comparison_markdown(rows[:1])
    assert "disagree" not in quiet and "busy" not in quiet.lower()


def test_missing_inputs_are_named_with_the_command_that_makes_them(
    repo_params: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an empty project: nothing has run
    inputs = read_inputs(params_from_mapping(repo_params).profile)
    assert inputs.profiles == []
    assert "`profiles/cpu/64-train/profile.json` is missing: run `dvc repro profile@cpu`." in inputs.missing
    assert "`profiles/cpu/comparisons.json` is missing: run `dvc repro profile@cpu`." in inputs.missing
    assert "`graph/summary.md` is missing: run `dvc repro export_graph`." in inputs.missing
    assert "`metrics/train.json` is missing: run `dvc repro train`." in inputs.missing


def test_report_is_built_from_profile_records_without_running_the_pipeline(
    repo_params: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    repo_params["profile"].update(batch_sizes=[1, 64], devices=["cpu"], modes=["inference"])
    params = params_from_mapping(repo_params)
    write_two_profiles()
    figures = tmp_path / "figures"
    figures.mkdir()
    report = build_report(params, figures)
    assert [(row.batch_size, row.step_time_ms) for row in report.rows] == [(1, 0.5), (64, 8.0)]
    row_64 = (
        "| 64 | cpu | inference | 8.000 | 0.800 | 7.840–8.160 | 400 / 100 | 0.1250 | 8000 | `aten::max_pool2d` (30.0 %)"
    )
    assert row_64 in report.markdown
    assert "#### Top 1 operators: batch 1, cpu, inference" in report.markdown
    assert (
        "**CPU inference, batch 1 → 64**: the time per sample fell to 0.250× (95 % CI 0.240–0.260, paired timing)."
        in report.markdown
    )
    assert (
        "| 64-cpu-inference / 1-cpu-inference | sample | 0.250 | 0.240-0.260 | ±4.0 | below 1 in all 6 processes |"
        in (report.markdown)
    )
    assert sorted(p.name for p in figures.iterdir()) == ["per_sample_time.png", "roofline.png", "throughput.png"]
    assert "`metrics/train.json` is missing: run `dvc repro train`." in report.markdown
    # Step analysis: anatomy with a verdict per row, FLOP/s against the peak, and how to add a GPU.
    assert "| 64 | cpu | inference | 8.000 | 16.000 | 90.0 | 10.0 | – | **operator-bound** |" in report.markdown
    assert "| 64 | cpu | inference | 64.0 | 8.000 | 8.00 | 100 | 8.00 |" in report.markdown  # 64 MFLOP in 8 ms
    assert "cpu: a 100 GFLOP/s stand-in" in report.markdown
    assert report_section(report.markdown, "cpu_vs_gpu").startswith("No GPU was profiled. To add one")
    assert report.markdown.count("No GPU was profiled. To add one") == 2  # the section and the analysis


def test_sections_are_numbered_when_rendered_and_referenced_by_key(repo_params: dict[str, Any], tmp_path: Path) -> None:
    """A section is one entry of SECTIONS: the renderer numbers those that apply, in order, and gives each
    reference to another section the number that section got."""
    assert len({section.key for section in SECTIONS}) == len({section.title for section in SECTIONS}) == len(SECTIONS)
    empty = ReportInputs(None, None, None, None, None, [])
    context = ReportContext(params_from_mapping(repo_params), empty, [], [], [], tmp_path)
    sections = [
        Section("first", "First", lambda _: [f"See {section_reference('third')}.\n"]),
        Section("second", "Second", lambda _: None),  # does not apply: no heading, no number
        Section("third", "Third", lambda _: ["Body.\n", "More.\n"]),
    ]
    rendered = ["## 1. First\n", "See section 2.\n", "## 2. Third\n", "Body.\n", "More.\n"]
    assert render_sections(sections, context) == rendered


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "quiet"])
def test_report_says_when_training_ran_on_a_busy_machine(
    repo_params: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy: bool
) -> None:
    """Images/s measured on a loaded machine is not quoted as the machine's speed."""
    monkeypatch.chdir(tmp_path)
    repo_params["profile"].update(batch_sizes=[1, 64], devices=["cpu"], modes=["inference"])
    write_two_profiles()
    for relative, text in {
        "metrics/train.json": json.dumps(
            {"epochs": 1, "steps": 2, "test_accuracy": 0.9, "test_loss": 0.3, "train_accuracy": 0.8, "train_loss": 0.5}
        ),
        "metrics/train_speed.json": json.dumps(
            {
                "images_per_second": 118.0,
                "train_seconds": 10.0,
                "cpu_share": 0.41 if busy else 0.99,
                "machine_busy": busy,
                "runtime": {"device": "cpu", "precision": "bf16", "execution": "eager", "threads": 2},
            }
        ),
        "plots/train_epochs.csv": "epoch,lr,train_loss,train_accuracy,test_loss,test_accuracy\n1,1,0.5,0.8,0.3,0.9\n",
        "plots/train_steps.csv": "step,epoch,train_loss,train_accuracy\n1,1,0.6,0.7\n2,1,0.5,0.8\n",
    }.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    figures = tmp_path / "figures"
    figures.mkdir()
    markdown = build_report(params_from_mapping(repo_params), figures).markdown
    assert "Training ran at 118 images/s." in markdown
    caveat = "**The machine was busy while training** (its threads got 41% of their CPUs): that speed is not"
    assert (caveat in markdown) is busy


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_report_stage_imports_no_torch() -> None:
    """The report only reads records: importing torch would cost every report run ~4 s."""
    probe = "import sys, stages.report, pipeline.tracking.tracker; assert 'torch' not in sys.modules, 'torch imported'"
    result = run_python(probe)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory, reproduced_project: Path) -> Path:
    return clone_project(reproduced_project, tmp_path_factory.mktemp("reported") / "project")


@pytest.mark.slow
def test_dvc_metrics_are_few_rounded_and_read_as_narrow_tables(reported: Path, run_in: Any) -> None:
    """`dvc metrics show` of the README's recipe reads in a terminal. The profile stages' DVC
    metrics are six rounded numbers with the same keys in every combination (one dense table, a row each), not the
    32 of timing.json + step_analysis.json per combination (214 leaves in all before)."""
    combinations = [f"{b}-cpu-{m}" for b in (1, 16, 64) for m in ("inference", "train")]
    shown = json.loads(run_in(reported, "dvc", "metrics", "show", "--json").stdout)[""]["data"]

    def leaves(value: Any) -> list[Any]:
        return [leaf for item in value.values() for leaf in leaves(item)] if isinstance(value, dict) else [value]

    # DVC's declared metrics: the paired ratios of the device, one file (each combination's own headline is in its
    # folder, shown by naming it as a target below).
    declared = {"metrics/train.json", "metrics/train_speed.json", "metrics/graph.json", "metrics/profile_cpu.json"}
    assert set(shown) == declared
    assert sum(len(leaves(entry["data"])) for entry in shown.values()) <= 60
    ratios = shown["metrics/profile_cpu.json"]["data"]
    assert "16-cpu-inference / 1-cpu-inference" in ratios and "64-cpu-train / 64-cpu-inference" in ratios
    assert all(set(value) == {"ratio", "ci_pct"} and value["ratio"] > 0 for value in ratios.values()), ratios
    profile_files = [f"profiles/cpu/{name.replace('-cpu-', '-')}/metrics.json" for name in combinations]
    graph = shown["metrics/graph.json"]["data"]  # one worst difference per exported program, not one per batch
    shown = json.loads(run_in(reported, "dvc", "metrics", "show", "--json", *profile_files).stdout)[""]["data"]
    keys = {path: set(shown[path]["data"]) for path in profile_files}
    assert all(found == keys[profile_files[0]] for found in keys.values()), keys
    assert {"per_sample_ms", "step_time_ci_pct", "noisy"} <= keys[profile_files[0]]
    for path in profile_files:  # rounded to 3 significant digits: a rerun lists no change in the 6th digit
        for value in (v for v in shown[path]["data"].values() if isinstance(v, float) and v):
            assert value == float(f"{value:.3g}"), (path, value)
    assert not [key for key in graph if "_batch" in key] and "onnxruntime_max_abs_difference" in graph
    table = run_in(reported, "dvc", "metrics", "show", *profile_files).stdout.splitlines()
    assert len(table) == 1 + len(combinations) and max(map(len, table)) <= 160, table
    assert [line.split()[0] for line in table[1:]] == profile_files


@pytest.mark.slow
def test_report_numbers_equal_the_stage_outputs(reported: Path) -> None:
    report = (reported / "report" / "report.md").read_text()
    hardware = json.loads((reported / "hardware/fingerprint.json").read_text())
    assert f"| CPU model | {hardware['cpu']} |" in report and f"| vCPUs | {hardware['cpu_count']} |" in report
    assert f"| PyTorch | {hardware['torch']} |" in report
    train = json.loads((reported / "metrics/train.json").read_text())
    assert (
        f"Test accuracy **{train['test_accuracy']:.4f}** (first 2,000 test images), test loss {train['test_loss']:.4f}"
        in report
    )
    # What ran, with the `auto` request beside it.
    ran = json.loads((reported / "metrics/train_speed.json").read_text())["runtime"]
    assert f"device `cpu` (`auto` in params.yaml), precision `{ran['precision']}` (`auto` in params.yaml)" in report
    requested = read_params(reported)["train"]["threads"]  # 1 in the tests' tiny params, 0 (one per core) by default
    asked = f" (`{requested}` in params.yaml)" if requested != ran["threads"] else ""
    assert f"`{ran['threads']}`{asked} thread(s)" in report
    graph = json.loads((reported / "metrics/graph.json").read_text())
    assert f"**{graph['total_parameters']:,}**" in report
    for name in (f"{b}-cpu-{m}" for b in (1, 16, 64) for m in ("inference", "train")):
        timing = json.loads((reported / "profiles" / "cpu" / name.replace("-cpu-", "-") / "timing.json").read_text())
        batch, _, mode = name.split("-")
        pattern = rf"^\| {batch} \| cpu \| {mode} \| ([\d.]+) \| [\d.]+ \| ([\d.]+)–([\d.]+) \|"
        row = re.search(pattern, report, re.MULTILINE)
        assert row and row.group(1) == f"{timing['step_time_ms_median']:.3f}", name
        interval = (f"{timing['step_time_ms_ci_low']:.3f}", f"{timing['step_time_ms_ci_high']:.3f}")
        assert (row.group(2), row.group(3)) == interval, name
        # The allocator what-if: this combination's row holds the record's numbers.
        record = json.loads((reported / "profiles" / "cpu" / name.replace("-cpu-", "-") / "profile.json").read_text())
        whatif = record["allocator_whatif"]
        what_if_row = re.search(rf"^\| {batch} {mode} \| ([\d.]+) \([\d.]+-[\d.]+\) \| ([\d.]+) ", report, re.MULTILINE)
        assert what_if_row, name
        assert what_if_row.group(1) == f"{whatif['step_time_ms_median']:.3f}", name
        assert what_if_row.group(2) == f"{timing['step_time_ms_median']:.3f}", name
        top_table = (
            (reported / "profiles" / "cpu" / name.replace("-cpu-", "-") / "top_operators.md")
            .read_text()
            .split("\n", 1)[1]
        )
        assert top_table in report
        # Memory and energy per step: this combination's peak and the range over the processes, as its record has them.
        memory = record["memory"]
        peak = f"{memory['peak_bytes'] / 1e6:.3f}"
        span = f"{memory['peak_low_bytes'] / 1e6:.3f}-{memory['peak_high_bytes'] / 1e6:.3f}"
        assert f"| {name} | {peak} | {span} |" in report, name
    assert "![memory at the step's peak" in report_section(report, "memory_energy")
    assert report.count("not exposed by this machine") == 1
    assert report_section(report, "allocator")
    assert f"| Memory allocator (profiles) | {record['settings']['allocator']} |" in report
    assert "## Missing inputs" not in report
    assert "and run `dvc repro`: the 6 cuda combinations are profiled beside the CPU ones" in report  # 3 x 2
    for name in (f"{b}-cpu-{m}" for b in (1, 16, 64) for m in ("inference", "train")):  # the step analysis
        step = json.loads(
            (reported / "profiles" / "cpu" / name.replace("-cpu-", "-") / "step_analysis.json").read_text()
        )
        batch, _, mode = name.split("-")
        # Untraced: the median of the steps run around the traced pass; hooks: the traced step beyond it.
        check = json.loads((reported / "profiles" / "cpu" / name.replace("-cpu-", "-") / "profile.json").read_text())[
            "trace_check"
        ]
        untraced = statistics.median(check["untraced_steps_ms"])
        hooks = 100 * (check["traced_step_ms"] / untraced - 1)
        anatomy = (
            rf"^\| {batch} \| cpu \| {mode} \| [\d.]+ \| {untraced:.3f} \| {check['traced_step_ms']:.3f} \| "
            rf"{re.escape(f'{hooks:+.1f}')} \| {step['busy_pct']:.1f} \| "
        )
        assert re.search(anatomy, report, re.MULTILINE), name
        assert (
            f"| {step['achieved_gflops_per_s']:.2f} | {step['peak_gflops_per_s']:.0f} | {step['peak_pct']:.2f} |"
            in report
        )
    for figure in (
        "training_curves.png",
        "per_sample_time.png",
        "throughput.png",
        "roofline.png",
        "roofline_intensity.png",
        "memory.png",
    ):
        with Image.open(reported / "report" / "figures" / figure) as image:
            assert image.width > 300 and image.height > 200
    html = (reported / "report" / "report.html").read_text()
    assert 'src="figures/' not in html and html.count("data:image/png;base64,") == 6
    assert "data:image/svg+xml;base64," in html and "<table>" in html


@pytest.mark.slow
def test_dvc_plots_show_draws_curves_and_batch_comparison(reported: Path, run_in: Any) -> None:
    result = run_in(reported, "dvc", "plots", "show", "--json")
    assert result.returncode == 0, result.stderr
    plots = json.loads(result.stdout)["data"]
    assert {"Loss per epoch", "Accuracy per epoch", "Per-sample time vs batch size", "Throughput vs batch size"} <= set(
        plots
    )
    content = plots["Per-sample time vs batch size"][0]["content"]
    series = {(value["batch_size"], value["series"]) for value in content["data"]["values"]}
    assert ("64", "cpu train") in series and ("1", "cpu inference") in series
    assert content["encoding"]["color"]["field"] == "series"
    # Error bars: the rendered spec's second layer spans each point's 95 % interval, from columns every row has.
    bars = content["layer"][1]
    assert bars["mark"]["type"] == "errorbar"
    assert (bars["encoding"]["y"]["field"], bars["encoding"]["y2"]["field"]) == (
        "per_sample_ms_ci_low",
        "per_sample_ms_ci_high",
    )
    for value in content["data"]["values"]:
        assert (
            float(value["per_sample_ms_ci_low"])
            <= float(value["per_sample_ms"])
            <= float(value["per_sample_ms_ci_high"])
        )
    throughput = plots["Throughput vs batch size"][0]["content"]
    assert throughput["layer"][1]["encoding"]["y2"]["field"] == "throughput_samples_per_s_ci_high"


@pytest.mark.slow
def test_dvc_plots_diff_draws_one_line_per_series_and_revision(reported: Path, run_in: Any) -> None:
    """The copy's HEAD holds the repository's comparison CSV, its workspace the one this run wrote."""
    result = run_in(reported, "dvc", "plots", "diff", "HEAD", "--json")
    assert result.returncode == 0, result.stderr
    (plot,) = json.loads(result.stdout)["data"]["Per-sample time vs batch size"]
    content = plot["content"]
    revisions = {value["rev"] for value in content["data"]["values"]}
    assert revisions == {"HEAD", "workspace"}
    encoding = content["encoding"]
    assert encoding["color"]["field"] == "series" and encoding["strokeDash"]["field"] == "rev"
    lines = {(value["series"], value["rev"]) for value in content["data"]["values"]}
    assert ("cpu train", "HEAD") in lines and ("cpu train", "workspace") in lines
    # The HTML page renders offline: Vega is inlined from .dvc/plots/offline.html, nothing loads from a CDN.
    assert run_in(reported, "dvc", "plots", "diff", "HEAD", "-o", "dvc_plots").returncode == 0
    page = (reported / "dvc_plots" / "index.html").read_text()
    assert "vegaEmbed(" in page and "<script src=" not in page and "cdn.jsdelivr" not in page


@pytest.mark.slow
def test_report_run_in_mlflow_holds_the_report_and_figures(reported: Path) -> None:
    client = MlflowClient(f"sqlite:///{reported / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'report'")
    assert run.info.status == "FINISHED" and run.data.metrics["report/combinations"] == 6
    # It names the runs whose outputs it read: the current train, export_graph and profile runs.
    used = {
        key[len("input.") :].replace("profile.", "profile@"): value
        for key, value in run.data.tags.items()
        if key.startswith("input.")
    }
    combinations = {f"profile@{batch}-cpu-{mode}" for batch in (1, 16, 64) for mode in ("inference", "train")}
    assert set(used) == {"train", "export_graph", *combinations}
    for name, run_id in used.items():
        producer = client.get_run(run_id)
        assert producer.info.run_name == name and producer.data.tags["dvc.outputs"] == "current"
    assert f"[train]({ui_url('', experiment.experiment_id, used['train'])})" in run.data.tags["mlflow.note.content"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "report.html", "figures"} <= artifacts
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert "figures/training_curves.png" in figures


@pytest.mark.slow
def test_a_dvc_experiment_that_reruns_only_the_report_links_to_the_baselines_runs(
    reported: Path, tmp_path: Path, run_in: Any
) -> None:
    """`dvc exp run` reruns what changed; the report it makes read every other output from the baseline's
    `dvc repro`, so it links to those runs (they carry no DVC experiment), and it alone is the current report."""
    project = clone_project(reported, tmp_path / "project")
    committed = run_in(project, "bash", "-c", "git add -A && git -c user.name=t -c user.email=t@e commit -qm baseline")
    assert committed.returncode == 0, committed.stderr
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("mnist-lab").experiment_id
    (baseline,) = client.search_runs([experiment_id], filter_string="tags.stage = 'report'")

    result = run_in(project, "dvc", "exp", "run", "--force", "--single-item", "report", "--name", "report-only")
    assert result.returncode == 0, result.stderr[-2000:]

    reports = client.search_runs([experiment_id], filter_string="tags.stage = 'report'")
    (rerun,) = [run for run in reports if run.info.run_id != baseline.info.run_id]
    assert rerun.data.tags["dvc.experiment"] == "report-only" and "dvc.experiment" not in baseline.data.tags
    inputs = {key: value for key, value in rerun.data.tags.items() if key.startswith("input.")}
    assert inputs == {key: value for key, value in baseline.data.tags.items() if key.startswith("input.")}
    assert len(inputs) == 2 + 6 and "Not in this store" not in rerun.data.tags["mlflow.note.content"]
    current = client.search_runs(
        [experiment_id], filter_string="tags.stage = 'report' and tags.`dvc.outputs` = 'current'"
    )
    assert [run.info.run_id for run in current] == [rerun.info.run_id]
    # Each producer recorded the md5 dvc.lock holds for the file the report found it by.
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    train_speed = next(out for out in lock["train"]["outs"] if out["path"] == "metrics/train_speed.json")
    recorded = json.loads(client.get_run(inputs["input.train"]).data.tags["dvc.outs.md5"])
    assert recorded["metrics/train_speed.json"] == train_speed["md5"]


@pytest.mark.slow
def test_removed_batch_size_leaves_no_trace_and_unrun_ones_are_named(reported: Path, run_in: Any) -> None:
    params = read_params(reported)
    params["profile"]["batch_sizes"] = [1, 16, 32]  # 64 removed (its folders stay on disk), 32 never run
    write_params(reported, params)
    result = run_in(reported, "dvc", "repro", "--single-item", "report")
    assert result.returncode == 0, result.stderr[-3000:]
    report = (reported / "report" / "report.md").read_text()
    assert (reported / "profiles" / "cpu" / "64-train").is_dir()
    assert (
        not re.search(r"^\| 64 \|", report, re.MULTILINE)
        and "batch 64, cpu" not in report
        and report.count("at batch 64") == report.count("epoch(s) at batch 64 on")  # only the training's batch
    )
    assert "`profiles/cpu/32-inference/profile.json` is missing: run `dvc repro profile@cpu`." in report


def test_the_machines_drift_is_stated_once_and_flags_no_row() -> None:
    """The Zen 5 report flagged every row "noisy machine" for a drift wider than the target; now a row whose
    processes agree carries no flag however the machine drifts, and the drift is one sentence of the environment."""
    from pipeline.report.lab_report import drift_sentence

    records = [
        make_record(1, "cpu", "inference", 0.5, (("aten::addmm", 20.0),), ci_pct=1.0),
        make_record(64, "cpu", "inference", 8.0, (("aten::max_pool2d", 30.0),), ci_pct=1.5),
    ]
    table = comparison_markdown(comparison_rows(records))
    assert "drift" not in table.split("\n\n")[0]  # the table itself
    assert not [row for row in comparison_rows(records) if row.flags()]
    assert "Processes disagree" not in table and "noisy" not in table
    # Eight 4-s windows whose log medians spread by 1 %: one more window within t(7) · 1 % · sqrt(9/8) = 2.51 % on the
    # log scale, 2.54 % as a ratio, said rounded up.
    windows = tuple(math.exp(0.01 * z) for z in (-1.5, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 1.5))
    probe = SpeedDrift(window_s=4.0, window_medians_ms=windows, workload="a fixed workload")
    sentence = drift_sentence({"cpu": probe})
    # What was measured, over how long, and what it cannot tell, each said: a 32 s probe says nothing of minutes.
    assert sentence.startswith("**Timed on a fixed workload in consecutive windows by the `roofs` stage")
    assert (
        "one more window would lie within ±2.6 % of the windows' geometric mean on the cpu (8 windows of 4 s)"
        in sentence
    ), sentence
    assert "as it did during the probe (32 s); how the speed moves over longer spans, the probe cannot tell" in sentence
    assert "minutes" not in sentence
    # Where this run's processes spread measurably wider than the probe's windows, its premise did not hold: said.
    from pipeline.records.profile import DeviceComparisons

    calm = DeviceComparisons("cpu", 6, (), process_speeds=(0.99, 1.0, 1.0, 1.01, 1.0, 1.005))
    assert "wider than the probe" not in drift_sentence({"cpu": probe}, [calm])
    spread = DeviceComparisons("cpu", 6, (), process_speeds=(1.172, 1.088, 0.900, 1.169, 0.910, 0.846))
    wider = drift_sentence({"cpu": probe}, [spread])
    assert "This run's timing processes spread wider than the probe's windows" in wider, wider
    assert re.search(r"is \d+\.\dx that of its 8 windows, beyond the one-sided 95 % F bound of 4\.0\)", wider), wider
    # As spread as the windows, only fewer: a wider prediction (Student's t), not a wider spread; nothing said.
    as_spread = DeviceComparisons(
        "cpu", 6, (), process_speeds=tuple(math.exp(0.01 * z) for z in (-1.3, -0.6, 0, 0, 0.6, 1.3))
    )
    assert "wider than the probe" not in drift_sentence({"cpu": probe}, [as_spread])
    assert "cancel whatever slows all combinations of a device alike" in sentence and "does not cancel" in sentence
    assert sentence.count(section_reference("comparison")) == 2  # each row's interval, the paired ratios
    assert "not measured" in drift_sentence({})


@pytest.mark.slow
def test_dvc_repro_writes_both_handins_filled_from_its_outputs(reproduced_project: Path) -> None:
    reported = reproduced_project  # read only: other tests here change `reported`
    chinese = (reported / "report" / "handin.zh.md").read_text()
    assert set(TEMPLATE_HEADINGS) <= set(headings(chinese))
    cells = [cell for table in tables(chinese)[:3] for row in table for cell in row]
    # The template's batch table is a numeric table with a header of its own: its label heads it.
    assert set(TEMPLATE_LABELS[:-2]) <= set(cells) and header(chinese, 2)[0] == TEMPLATE_LABELS[-2]
    assert all(cell and not UNFILLED.search(cell) for cell in cells)
    english = (reported / "report" / "handin.en.md").read_text()
    accuracy = json.loads((reported / "metrics" / "train.json").read_text())["test_accuracy"]
    assert f"测试集正确率 {accuracy:.4f}" in chinese
    comparisons = json.loads((reported / "profiles" / "cpu" / "comparisons.json").read_text())["comparisons"]
    paired = next(c for c in comparisons if (c["numerator"], c["denominator"]) == ("64-cpu-train", "16-cpu-train"))
    value, low, high = paired["value"], paired["low"], paired["high"]
    (batch_64,) = [row for row in tables(chinese)[2] if row[:2] == ["64", "CPU 训练"]]
    assert batch_64[-1].startswith(f"{value:.3f} 倍（{low:.3f}–{high:.3f}），")
    assert "### 实验结果分析" in chinese and "### Analysis of the results" in english
    assert english.startswith("# Lab report: Lab 1") and sorted(numbers(english)) == sorted(numbers(chinese))
    for language in ("zh", "en"):
        assert (reported / "report" / f"handin.{language}.html").read_text().count("data:image/png;base64,") == 2


@pytest.mark.slow
def test_changing_the_handin_languages_reruns_only_the_report(
    reproduced_project: Path, tmp_path: Path, run_in: Any
) -> None:
    project = clone_project(reproduced_project, tmp_path / "project")
    params = read_params(project)
    params["report"]["languages"] = ["en"]
    write_params(project, params)
    status = json.loads(run_in(project, "dvc", "status", "--json").stdout)
    assert set(status) - {"validate"} == {"report"}  # validate is always_changed, and changes nothing after it
    assert {"changed deps": {"params.yaml": {"report.languages": "modified"}}} in status["report"]
    result = run_in(project, "dvc", "repro")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(path.name for path in (project / "report").glob("handin.*")) == ["handin.en.html", "handin.en.md"]
