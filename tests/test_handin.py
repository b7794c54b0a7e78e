"""The hand-in: the course's template filled from the pipeline's outputs, in each language of `report.languages`.

A real report stage run in process (the committed training and graph outputs, two profile records, its own MLflow
store), the H100 reference run's records, and the catalogues read as files.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import typing
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
import yaml
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font
from mlflow import MlflowClient
from PIL import Image

from pipeline.common.errors import PipelineError
from pipeline.common.paths import GRAPH_SVG, TRAIN_METRICS
from pipeline.devices.registry import device_names
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import Language, ProfileMode
from pipeline.records.profile import ProfileRecord
from pipeline.records.quantities import MEMORY_PARTS, STEP_GROUPS, STEP_PHASES
from pipeline.report.catalogue import CATALOGUES, LANGUAGES, load_catalogue, placeholders
from pipeline.report.comparison import comparison_rows
from pipeline.report.figures import charmap, missing_glyphs, save_figure
from pipeline.report.handin import (
    HandinFigures,
    conditions_note,
    draw_figures,
    environment_table,
    gpu_section,
    handin_markdown,
    paired_note,
)
from pipeline.report.handin_figures import (
    FIGURE_WORDS,
    SIMPLIFIED_CHINESE_FACE,
    _font_for,
    bundled_cjk_font,
    figure_font,
)
from pipeline.report.lab_report import ReportInputs
from pipeline.report.tensorboard_views import GRAPH_VIEW, RECORD, SCALARS_VIEW, SHOWS_OUTPUTS, VIEWS, current_views
from pipeline.tracking.lineage import file_md5
from tests.helpers.handin import TEMPLATE_HEADINGS, TEMPLATE_LABELS, UNFILLED, header, headings, numbers, tables
from tests.helpers.projects import run_report_stage
from tests.helpers.records import gpu_run, gpu_run_file, make_comparisons, make_record, record_metrics
from tests.helpers.repo import REPO_PARAMS, REPO_ROOT


def test_every_language_has_a_catalogue_with_the_same_keys_and_placeholders() -> None:
    assert set(LANGUAGES) == set(typing.get_args(Language)) == {path.stem for path in CATALOGUES.glob("*.toml")}
    english = load_catalogue("en").messages
    for language in LANGUAGES:
        messages = load_catalogue(language).messages
        assert set(messages) == set(english), language
        for key, message in messages.items():
            assert placeholders(message) == placeholders(english[key]), (language, key)
            assert message.strip() or key.endswith("_joiner"), (language, key)  # a joiner may be no character


def test_every_message_is_said_somewhere() -> None:
    """Each key is named in the code that says it, or (a finding's words) built from a name that code holds: a device,
    mode, layer group, phase or memory part."""
    modules = (
        "handin.py",
        "handin_analysis.py",
        "handin_figures.py",
        "findings.py",
        "conclusion.py",
        "lab_report.py",
    )
    source = "".join((REPO_ROOT / "pipeline/report" / name).read_text() for name in modules)
    source += (REPO_ROOT / "stages/report.py").read_text()
    built = {f"device_{d}" for d in device_names()} | {f"mode_{m}" for m in typing.get_args(ProfileMode)}
    built |= {f"group_{g}" for g in STEP_GROUPS} | {f"phase_{p}" for p in STEP_PHASES}
    built |= {f"memory_{part.replace(' ', '_')}" for part in MEMORY_PARTS}
    said = [key for key in load_catalogue("en").messages if f'"{key}"' in source or f"'{key}'" in source]
    unused = set(load_catalogue("en").messages) - set(said) - built
    assert not unused
    assert not built - set(load_catalogue("en").messages)  # every name the code builds a key from has its words


@pytest.mark.parametrize(
    ("languages", "said"),
    [
        (["fr"], "`report.languages[0]` = 'fr' is not allowed; choose one of 'zh', 'en'"),
        ([], "`report.languages` is an empty list"),
        (["zh", "zh"], "`report.languages` = ['zh', 'zh'] repeats a value"),
    ],
)
def test_a_language_without_a_catalogue_stops_validation(
    repo_params: dict[str, Any], languages: list[str], said: str
) -> None:
    repo_params["report"]["languages"] = languages
    with pytest.raises(PipelineError) as raised:
        params_from_mapping(repo_params)
    assert said in str(raised.value) and "invalid value(s)" in str(raised.value)


@pytest.fixture(scope="module")
def handed_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report stage run in process: batch 1 and 64 (cpu, inference), no GPU, both languages."""
    return run_report_stage(tmp_path_factory.mktemp("handin"), "handin")


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_the_chinese_handin_holds_every_heading_and_label_of_the_template_and_fills_every_cell(
    handed_in: Path,
) -> None:
    markdown = (handed_in / "report" / "handin.zh.md").read_text()
    assert headings(markdown)[0].startswith("实验报告")
    assert set(TEMPLATE_HEADINGS) <= set(headings(markdown))
    environment, visualisation, batches = tables(markdown)[:3]
    cells = [cell for table in (environment, visualisation) for row in table for cell in row]
    # The template's batch table (批大小 | 结果比较) is a numeric table with a header of its own.
    assert all(label in cells for label in TEMPLATE_LABELS[:-2]), [x for x in TEMPLATE_LABELS if x not in cells]
    assert (
        TEMPLATE_LABELS[-2] == "批大小" and header(markdown, 2)[0] == "批大小" and "结果比较" in headings(markdown)[4]
    )
    assert all(cell and not UNFILLED.search(cell) for cell in cells + [c for row in batches for c in row])
    assert [row[0] for row in batches] == ["1", "64"]  # the rows follow profile.batch_sizes
    # Batch 64: its timing, and the helper's paired ratio of batch 64 over 1, 0.25 (0.24-0.26), below 1 in all six
    # processes (so no count of them is said).
    assert batches[1] == [
        "64",
        "CPU 推理",
        "8.000（7.840–8.160）",
        "0.1250",
        "8000",
        "0.250 倍（0.240–0.260），缩短",
    ]
    assert header(markdown, 2)[2] == "每步耗时 ms（中位数，95% 置信区间）"
    assert "模板的表格还有批大小 16 的行，这里没有做性能分析：把它们加入 `profile.batch_sizes` 即可补上。" in markdown
    assert environment[1][2] == "无" and environment[4][2].endswith("未使用：没有在 GPU 上做性能分析")
    assert "![神经网络数据流图](figures/model_graph.svg)" in visualisation[0][1]
    train = yaml.safe_load((handed_in / "params.yaml").read_text())["train"]  # the recipe the curves come from
    assert (
        f"（Adadelta，学习率 {train['lr']:g}，每轮后按 StepLR 乘以 {train['gamma']:g}，随机种子 {train['seed']}）"
        in (visualisation[1][1])
    )
    assert "批大小 1，CPU 推理：`aten::mkldnn_convolution`（40.0%）" in visualisation[2][1]
    assert load_catalogue("zh")("gpu_missing") in markdown  # no GPU profile: one line on how to add it
    assert "](report.md)" in markdown


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_both_languages_state_the_same_numbers_in_the_same_tables(handed_in: Path) -> None:
    chinese = (handed_in / "report" / "handin.zh.md").read_text()
    english = (handed_in / "report" / "handin.en.md").read_text()
    assert sorted(numbers(chinese)) == sorted(numbers(english)) and numbers(chinese)
    assert [[len(row) for row in table] for table in tables(chinese)] == [
        [len(row) for row in table] for table in tables(english)
    ]
    assert "| Hardware | CPU (vCPUs) |" in english and not re.search(r"[\u4e00-\u9fff]", english)


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_the_handins_are_artifacts_of_the_report_run(handed_in: Path) -> None:
    client = MlflowClient(f"sqlite:///{handed_in / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("handin")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'report'")
    artifacts = {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
    assert {"handin.zh.md", "handin.zh.html", "handin.en.md", "handin.en.html"} <= artifacts
    logged = Path(client.download_artifacts(run.info.run_id, "handin.zh.md", str(handed_in / "downloaded")))
    text = logged.read_text()
    # MLflow's preview shows no relative image: each figure is named by its artifact, in the hand-in's language.
    assert "**图：损失和正确率趋势图**：本次运行的 artifact `figures/handin_curves.zh.png`。" in text
    assert "](figures/" not in text
    page = (handed_in / "report" / "handin.zh.html").read_text()
    assert '<html lang="zh-CN">' in page and 'href="report.html"' in page
    assert page.count('src="data:image/png;base64,') == 2 and 'src="data:image/svg+xml;base64,' in page


def _embedded_pngs(page: str) -> list[Image.Image]:
    return [
        Image.open(io.BytesIO(base64.b64decode(data)))
        for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    ]


@pytest.mark.slow  # the report stage and its MLflow store in process: seconds
def test_the_handin_figures_draw_every_character_of_their_text(handed_in: Path) -> None:
    """A glyph the font lacks is an empty box in a PNG; each figure states its texts in its metadata. The Chinese
    hand-in's figures carry Chinese titles, axis labels and legends (the bundled font has every character), and
    draw every character they hold."""
    page = (handed_in / "report" / "handin.zh.html").read_text()
    catalogue = load_catalogue("zh")
    family = figure_font(catalogue)
    assert family is not None, "no font draws the Chinese figures' words: is noto-cjk-sans-otc installed?"
    fonts = [font_manager.findfont(font_manager.FontProperties())]
    fonts.append(font_manager.findfont(font_manager.FontProperties(family=family)))
    covered = set().union(*(FT2Font(font).get_charmap() for font in fonts))
    texts = [image.text["Description"] for image in _embedded_pngs(page)]
    assert any("aten::mkldnn_convolution" in text for text in texts)
    assert all(ord(ch) in covered for text in texts for ch in text if not ch.isspace())
    words = {
        word
        for text in texts
        for word in re.findall(r"[A-Za-z]{2,}|[\u4e00-\u9fff]+", re.sub(r"\$[^$]*\$|\S*::\S*", "", text))
    }
    latin = {word for word in words if word.isascii()}
    assert catalogue("fig_step") in "".join(texts) and latin <= {"CPU", "GPU", "CUDA", "epoch"}, latin
    for key in ("fig_loss", "fig_accuracy", "fig_train_steps", "fig_test_epochs"):
        assert catalogue(key) in "".join(texts), key


def test_the_chinese_figures_have_words_on_a_machine_without_a_cjk_font(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every font matplotlib and the system know that draws Chinese hidden, as on a fresh Linux machine, the
    figures' words are still drawn, by the bundled Noto Sans CJK's simplified-Chinese face, glyph for glyph."""
    catalogue = load_catalogue("zh")
    words = "".join(catalogue(key) for key in FIGURE_WORDS)
    bundled = bundled_cjk_font()
    assert bundled is not None
    cjk = {entry.fname for entry in font_manager.fontManager.ttflist if 0x4E2D in charmap(entry.fname)} - {bundled}
    monkeypatch.setattr(
        font_manager.fontManager,
        "ttflist",
        [entry for entry in font_manager.fontManager.ttflist if entry.fname not in cjk],
    )
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *_, **__: [])
    _font_for.cache_clear()
    try:
        family = figure_font(catalogue)
        assert family == SIMPLIFIED_CHINESE_FACE
        figure, axes = plt.subplots()
        axes.set_title(words, family=family)
        assert missing_glyphs(figure) == {}
        plt.close(figure)
    finally:
        _font_for.cache_clear()


def test_a_figure_whose_font_lacks_a_glyph_is_refused(tmp_path: Path) -> None:
    figure, axes = plt.subplots()
    axes.set_title("损失 loss")
    assert missing_glyphs(figure) == {"DejaVuSans.ttf": "失损"}
    with pytest.raises(PipelineError, match=re.escape("DejaVuSans.ttf lacks '失损'")):
        save_figure(figure, tmp_path / "boxes.png")
    assert not (tmp_path / "boxes.png").exists()


def _cpu_only_inputs(records: list[ProfileRecord], ratios: dict[tuple[str, str], Any]) -> ReportInputs:
    return ReportInputs(
        hardware={"cpu": "Test CPU", "cpu_count": "2", "gpus": "none", "os": "Linux", "machine": "x86_64"},
        train_metrics=None,
        train_speed=None,
        graph_metrics=None,
        model_summary=None,
        profiles=records,
        comparisons=[make_comparisons("cpu", ratios)],
    )


@pytest.mark.parametrize(
    ("paired", "cell", "note"),
    [
        ((0.9, 0.85, 0.95, (0.9,) * 6), "0.900× (0.850–0.950), shorter", ""),
        ((1.1, 1.05, 1.15, (1.1,) * 5 + (0.99,)), "1.100× (1.050–1.150), longer (above 1 in 5 of 6 processes)", ""),
        (
            (1.0, 0.97, 1.04, (0.98, 1.02) * 3),
            "1.000× (0.970–1.040), cannot tell",
            "batch 16, CPU inference: Time per sample against batch 1: the data cannot tell them apart (1.000×, 95 % "
            "CI 0.970–1.040); at the spread observed, more than 40 timing processes would be needed.",
        ),
    ],
    ids=["cheaper", "dearer", "undecided"],
)
def test_a_batch_row_states_a_direction_only_where_the_paired_interval_excludes_one(
    repo_params: dict[str, Any], paired: tuple[float, float, float, tuple[float, ...]], cell: str, note: str
) -> None:
    """The ratio's cell says a direction only where its interval excludes 1 (and how many processes disagreed where
    some did); what would decide an undecided one is said once, under the table."""
    repo_params["profile"].update(batch_sizes=[1, 16], devices=["cpu"], modes=["inference"])
    records = [make_record(1, "cpu", "inference", 1.0), make_record(16, "cpu", "inference", 16 * paired[0])]
    inputs = _cpu_only_inputs(records, {("16-cpu-inference", "1-cpu-inference"): paired})
    markdown = handin_markdown(
        inputs,
        comparison_rows(records),
        params_from_mapping(repo_params),
        HandinFigures(False, False, False),
        load_catalogue("en"),
    )
    (batch_16,) = [row for row in tables(markdown)[2] if row[0] == "16"]
    assert batch_16[-1] == cell
    assert ("shorter" in batch_16[-1], "longer" in batch_16[-1]) == (paired[2] < 1, paired[1] > 1)
    notes = markdown.split("### 3.")[0].split("| 16 |")[-1]  # under the table, before the GPU section
    assert (note in notes) if note else ("processes would be needed" not in notes)


@pytest.mark.parametrize(
    ("language", "too_few", "undecided"),
    [
        ("en", "comes from only 2 timing processes, too few to pin the median down to ±2 %", "cannot tell"),
        ("zh", "其区间只来自 2 个计时进程，太少", "无法区分"),
    ],
)
def test_a_row_is_flagged_only_where_its_uncertainty_could_change_a_conclusion(
    repo_params: dict[str, Any], language: Language, too_few: str, undecided: str
) -> None:
    """Batch 1's processes spread ±6 %, but every direction read from it is decided by its paired ratio: no flag.
    Batch 16's interval comes from two processes: flagged, with the setting that fixes it."""
    repo_params["profile"].update(batch_sizes=[1, 16], devices=["cpu"], modes=["inference"])
    records = [
        make_record(1, "cpu", "inference", 1.0, ci_pct=6.0),  # 6 processes that disagree
        dataclasses.replace(make_record(16, "cpu", "inference", 8.0, ci_pct=30.0), process_step_times_ms=(7.8, 8.2)),
    ]
    inputs = _cpu_only_inputs(records, {("16-cpu-inference", "1-cpu-inference"): (0.5, 0.4, 0.6, (0.5,) * 6)})
    markdown = handin_markdown(
        inputs,
        comparison_rows(records),
        params_from_mapping(repo_params),
        HandinFigures(False, False, False),
        load_catalogue(language),
    )
    rows = {row[0]: row for row in tables(markdown)[2]}
    notes = markdown.split("### 3.")[0].split("| 16 |")[-1]  # under the table, before the GPU section
    words = {
        "en": ("batch 1, CPU inference", "batch 16, CPU inference"),
        "zh": ("批大小 1，CPU 推理", "批大小 16，CPU 推理"),
    }
    batch_1, batch_16 = words[language]
    assert batch_1 not in notes  # its timing, and nothing flagged
    prefix = load_catalogue(language)("row_note", combination=batch_16, note="")
    (flagged,) = [line for line in notes.splitlines() if line.startswith(prefix) and too_few in line]
    assert undecided not in rows["16"][-1] and "`profile.processes: 6`" in flagged


def _reference_record(name: str) -> ProfileRecord:
    """A reference profile as the report reads one: its steps re-estimated (median, 95 % CI), its top operators and
    the H100 machine's hardware."""
    raw = json.loads((gpu_run_file(name, "profile.json")).read_text())
    metrics = record_metrics(raw)
    combination = raw["combination"]
    operators = tuple((row["operator"], row["share_pct"]) for row in raw["top_operators"][:10])
    record = make_record(
        combination["batch_size"], combination["device"], combination["mode"], metrics["step_time_ms_median"], operators
    )
    timing = dataclasses.replace(
        record.timing,
        step_time_ms_ci_low=metrics["step_time_ms_ci_low"],
        step_time_ms_ci_high=metrics["step_time_ms_ci_high"],
    )
    return dataclasses.replace(record, timing=timing, hardware=raw["hardware"])


def test_a_handin_from_the_h100_reference_compares_cpu_and_gpu_with_its_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no training or graph outputs here: those cells name their command
    names = [
        f"{batch}-{device}-{mode}"
        for batch in (1, 16, 64)
        for device in ("cpu", "cuda")
        for mode in ("inference", "train")
    ]
    records = [_reference_record(name) for name in names]
    inputs = ReportInputs(
        hardware=json.loads((gpu_run() / "hardware" / "fingerprint.json").read_text()),
        train_metrics=json.loads((gpu_run() / "metrics" / "train.json").read_text()),
        train_speed=None,
        graph_metrics=None,
        model_summary=None,
        profiles=records,
    )
    params = dict(REPO_PARAMS, profile={**REPO_PARAMS["profile"], "devices": ["cpu", "cuda"]})
    figures = tmp_path / "figures"
    figures.mkdir()
    drawn = draw_figures(inputs, figures, ["zh"])  # twelve panels, CUDA kernels' names cut short
    assert drawn == HandinFigures(graph=False, curves=False, operators=True, languages=("zh",))
    rows = comparison_rows(records)
    markdown = handin_markdown(inputs, rows, params_from_mapping(params), drawn, load_catalogue("zh"))
    environment = tables(markdown)[0]
    assert environment[1][2] == "NVIDIA H100 80GB HBM3 × 1"
    assert environment[4][2] == "13.0（PyTorch 构建）；13.0（GPU 性能分析使用的运行时）"
    gpu = tables(markdown)[3]
    by_name = {row.combination.name: row for row in rows}
    for batch in (1, 16, 64):
        for mode in ("inference", "train"):
            cpu, cuda = by_name[f"{batch}-cpu-{mode}"], by_name[f"{batch}-cuda-{mode}"]
            words = {"inference": "推理", "train": "训练"}[mode]
            assert [str(batch), words, f"{cpu.per_sample_ms:.4f}", f"{cuda.per_sample_ms:.4f}"] in [
                row[:4] for row in gpu
            ]
    (batch_64_inference,) = [row for row in gpu if row[:2] == ["64", "推理"]]
    assert re.fullmatch(r"\d+\.\d\d 倍（\d+\.\d\d–\d+\.\d\d 倍）", batch_64_inference[4])  # measurably faster
    assert load_catalogue("zh")("gpu_note") in markdown and load_catalogue("zh")("gpu_missing") not in markdown
    assert "没有与批大小 1 的配对比值：运行 `dvc repro profile@cuda`。" in markdown  # it predates paired timing
    assert gpu_section(comparison_rows(records[:2]), load_catalogue("en")).startswith("No GPU was profiled.")


@pytest.mark.parametrize(
    ("language", "cpu", "instruction_sets", "packages"),
    [
        (
            "zh",
            "Test CPU，2 个 vCPU（`/proc/cpuinfo` 中 `cpu family` 为 25、`model` 为 17）",
            "支持的指令集扩展（影响 PyTorch 选用的计算内核）：AVX2、AVX-512（VNNI、BF16）、AMX（BF16）",
            "PyTorch 2.15.0<br>torchvision 0.29.2<br>TensorBoard 2.21.0<br>Python 3.11.7",
        ),
        (
            "en",
            "Test CPU, family 25, model 17 (2 vCPUs)",
            "Instruction-set extensions (PyTorch picks its kernels by them): AVX2, AVX-512 (VNNI, BF16), AMX (BF16)",
            "PyTorch 2.15.0<br>torchvision 0.29.2<br>TensorBoard 2.21.0<br>Python 3.11.7",
        ),
    ],
)
def test_the_environment_names_the_cpu_s_instruction_sets_and_tensorboard_beside_pytorch(
    language: Language, cpu: str, instruction_sets: str, packages: str
) -> None:
    """The CPU's cell says the kernel features the fingerprint recorded, each extension beside its family; the
    packages' cell TensorBoard's version beside PyTorch's. Neither is said where it was not recorded."""
    fingerprint = {
        "cpu": "Test CPU",
        "cpu_count": "2",
        "cpu_family_model": "family 25, model 17",
        "cpu_features": "avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16",
        "gpus": "none",
        "os": "Linux",
        "machine": "x86_64",
        "python": "3.11.7",
        "torch": "2.15.0",
        "torchvision": "0.29.2",
    }
    inputs = ReportInputs(fingerprint, None, None, None, None, [], tensorboard="2.21.0")
    catalogue = load_catalogue(language)
    environment = tables(environment_table(inputs, catalogue))[0]
    assert environment[0][2] == f"{cpu}<br>{instruction_sets}"
    assert environment[3][2] == packages
    older = ReportInputs({**fingerprint, "cpu_features": "unknown"}, None, None, None, None, [])
    environment = tables(environment_table(older, catalogue))[0]
    assert environment[0][2] == cpu and "TensorBoard" not in environment[3][2]


@pytest.mark.parametrize(
    ("language", "said"),
    [
        (
            "en",
            (
                "On the CPU, the timing processes ran 2 at a time, each with 1 CPU thread (no process pinned to a "
                "core).",
                "both ran on 1 CPU thread in fp32. One thread, because the project measured earlier",
                "(`train.threads: 0` and `train.precision: auto` in `params.yaml`: a thread per core, bf16 where the "
                "CPU computes it natively; PyTorch itself defaults to fp32): 2 CPU threads, bf16.",
            ),
        ),
        (
            "zh",
            (
                "CPU 上的计时进程每次 2 个同时运行，各用 1 个 CPU 线程（进程没有绑定到固定的核）。",
                "都用 1 个 CPU 线程、fp32 精度。只用 1 个线程，依据的是本项目此前在 2 个 vCPU 的虚拟机上的测量",
                "实际用了 2 个 CPU 线程、bf16。",
            ),
        ),
    ],
)
def test_the_method_says_the_processes_side_by_side_and_the_counts_in_the_language_s_words(
    repo_params: dict[str, Any], language: Language, said: tuple[str, ...]
) -> None:
    """Two timing processes at once, one thread each: said with the tables; a count is said in the singular where it
    is one (English), and the training's defaults as the pipeline's, not PyTorch's."""
    record = make_record(1, "cpu", "inference", 1.0)
    record = dataclasses.replace(record, settings=dataclasses.replace(record.settings, threads=1, processes_at_once=2))
    inputs = dataclasses.replace(
        _cpu_only_inputs([record], {}),
        train_speed={"images_per_second": 1800.0, "runtime": {"threads": 2, "precision": "bf16"}},
    )
    catalogue = load_catalogue(language)
    text = paired_note(inputs, catalogue) + conditions_note(inputs, params_from_mapping(repo_params), catalogue)
    assert all(words in text for words in said), [words for words in said if words not in text]
    alone = dataclasses.replace(record, settings=dataclasses.replace(record.settings, processes_at_once=1))
    plain = paired_note(dataclasses.replace(inputs, profiles=[alone]), catalogue)  # one process at a time
    assert said[0] not in plain and plain.strip() in text
    assert [catalogue.counted(n, "count_epoch", "count_epochs") for n in (1, 2)] == (
        ["1 epoch", "2 epochs"] if language == "en" else ["1 轮", "2 轮"]
    )


def test_tensorboard_views_are_used_only_while_they_go_with_the_current_training_and_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert current_views() is None  # none taken
    for path, text in ((TRAIN_METRICS, '{"test_accuracy": 0.99}'), (GRAPH_SVG, "<svg/>")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    VIEWS.mkdir()
    for view in (GRAPH_VIEW, SCALARS_VIEW):
        view.write_bytes(b"png")
    RECORD.write_text(json.dumps({key: file_md5(path) for key, path in SHOWS_OUTPUTS.items()}))
    assert current_views() == (GRAPH_VIEW, SCALARS_VIEW)
    GRAPH_SVG.write_text("<svg>another graph</svg>")
    assert current_views() == str(GRAPH_SVG)  # the output that changed since, for the hand-in to name
    GRAPH_VIEW.unlink()
    assert current_views() is None
