"""DVC stage `report`: the lab report (markdown + self-contained HTML) from every stage's outputs."""

import tempfile
from pathlib import Path

from pipeline.common.interrupts import pause_at
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import PROFILE_COMPARISON_PLOT, REPORT_DIR, REPORT_FIGURES, REPORT_HTML, REPORT_MARKDOWN
from pipeline.common.stage_runner import run_stage_process
from pipeline.common.tables import rows_csv
from pipeline.params.loading import load_params
from pipeline.report.comparison import COMPARISON_PLOT_FIELDS
from pipeline.report.handin import handins
from pipeline.report.lab_report import TITLE, build_report, report_input_runs
from pipeline.report.rendering import (
    markdown_for_mlflow,
    markdown_for_tensorboard,
    markdown_to_html,
    tensorboard_image_tag,
)
from pipeline.tracking.lifecycle import STAGE_DESCRIPTIONS, open_tracker


def main() -> None:
    params = load_params()
    pause_at("params-loaded")
    with (
        tempfile.TemporaryDirectory() as scratch,
        open_tracker("report", params.tracking) as tracker,
        AtomicOutputs() as outputs,
    ):
        outputs.own(REPORT_DIR)  # a direct run removes what the new report no longer holds, as `dvc repro` does
        pause_at("run-started")
        figures = Path(scratch) / "figures"
        figures.mkdir()
        report = build_report(params, figures)
        pause_at("report-built")
        html = markdown_to_html(report.markdown, TITLE, Path(scratch))
        pause_at("html-rendered")
        outputs.write_text(REPORT_MARKDOWN, report.markdown)
        outputs.write_text(REPORT_HTML, html)
        written, handin_figures = handins(report, params, Path(scratch))
        for handin in written:
            markdown_name, page_name = handin.names
            outputs.write_text(REPORT_DIR / markdown_name, handin.markdown)
            outputs.write_text(REPORT_DIR / page_name, handin.page)
            tracker.log_artifact_text(handin.for_mlflow, markdown_name)
            tracker.log_artifact_text(handin.page, page_name)
        pause_at("handins-written")
        for figure in sorted(figures.iterdir()):
            outputs.write_bytes(REPORT_FIGURES / figure.name, figure.read_bytes())
            tracker.log_artifact(figure, "figures")
            tag = tensorboard_image_tag(f"figures/{figure.name}")
            if tag is not None and figure.name not in handin_figures.files:  # the hand-ins are MLflow artifacts only
                tracker.log_png_file(tag, figure)
        pause_at("figures-logged")
        outputs.write_text(PROFILE_COMPARISON_PLOT, rows_csv(COMPARISON_PLOT_FIELDS, report.comparison_csv_rows()))
        # Neither tool shows the file's relative `figures/` images: each gets a variant naming where they are.
        tracker.log_text("report/markdown", markdown_for_tensorboard(report.markdown))
        tracker.log_artifact_text(markdown_for_mlflow(report.markdown), "report.md")
        tracker.log_artifact_text(html, "report.html")
        tracker.log_summary({"combinations": len(report.rows)}, prefix="report/")
        tracker.link_inputs(report_input_runs(report), STAGE_DESCRIPTIONS["report"])
        pause_at("logged")
    pages = ", ".join(str(REPORT_DIR / name) for handin in written for name in handin.names)
    print(f"report written to {REPORT_MARKDOWN} and {REPORT_HTML} ({len(report.rows)} profiled combination(s))")
    print(f"hand-ins (the course's template, filled in): {pages}")
    print(f"MLflow: {tracker.view_hint()}")


if __name__ == "__main__":
    run_stage_process("report", main)
