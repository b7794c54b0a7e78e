"""The lab report, generated from the stage outputs: environment, graph, training, profiles, analysis.

Every number in it is read from a stage output (nothing is re-measured), and every input that is
missing is named in the report with the command that produces it, never silently dropped.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import ProfileConfig
from pipeline.paths import profile_outputs
from pipeline.profiling import Combination

CONVOLUTION = re.compile(r"conv", re.IGNORECASE)


def combinations(config: ProfileConfig) -> list[Combination]:
    """Exactly the combinations params.yaml asks for: stale folders of removed values never count."""
    return [Combination(b, d, m) for b in config.batch_sizes for d in config.devices for m in config.modes]


@dataclass
class ReportInputs:
    hardware: dict[str, str] | None
    train_metrics: dict[str, float] | None
    train_speed: dict[str, float] | None
    graph_metrics: dict[str, float] | None
    model_summary: str | None
    profiles: list[dict[str, Any]]  # profile.json records, in params order
    missing: list[str] = field(default_factory=list)  # one sentence per absent input


def read_json(path: Path, producer: str, missing: list[str]) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        missing.append(f"`{path}` is missing: run `dvc repro {producer}`.")
        return None


def read_inputs(config: ProfileConfig, hardware: Path, train_metrics: Path, train_speed: Path, graph_metrics: Path, summary: Path) -> ReportInputs:
    missing: list[str] = []
    profiles = []
    for combination in combinations(config):
        record = read_json(profile_outputs(combination.name).record, f"profile@{combination.name}", missing)
        if record is not None:
            profiles.append(record)
    model_summary = summary.read_text() if summary.exists() else None
    if model_summary is None:
        missing.append(f"`{summary}` is missing: run `dvc repro export_graph`.")
    return ReportInputs(
        hardware=read_json(hardware, "hardware", missing),
        train_metrics=read_json(train_metrics, "train", missing),
        train_speed=read_json(train_speed, "train", missing),
        graph_metrics=read_json(graph_metrics, "export_graph", missing),
        model_summary=model_summary,
        profiles=profiles,
        missing=missing,
    )


def comparison_rows(profiles: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for record in profiles:
        timing, top = record["timing"], record["top_operators"]
        rows.append(
            {
                **record["combination"],
                "series": "{device} {mode}".format(**record["combination"]),  # one plotted line
                "step_time_ms": timing["step_time_ms_mean"],
                "step_time_cv": timing["step_time_cv"],
                "per_sample_ms": timing["per_sample_ms"],
                "throughput_samples_per_s": timing["throughput_samples_per_s"],
                "top_operator": top[0]["operator"] if top else "",
                "top_operator_share_pct": top[0]["share_pct"] if top else 0.0,
                "convolution_share_pct": sum(row["share_pct"] for row in top if CONVOLUTION.search(row["operator"])),
            }
        )
    return rows


def comparison_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| batch | device | mode | step ms (CV) | per-sample ms | samples/s | top operator (share) | convolution share |",
        "| ---: | --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['batch_size']} | {row['device']} | {row['mode']} | {row['step_time_ms']:.3f} ({row['step_time_cv']:.1%}) | "
            f"{row['per_sample_ms']:.4f} | {row['throughput_samples_per_s']:.0f} | `{row['top_operator']}` "
            f"({row['top_operator_share_pct']:.1f} %) | {row['convolution_share_pct']:.1f} % |"
        )
    return "\n".join(lines) + "\n"


def environment_markdown(hardware: dict[str, str], profiles: Sequence[dict[str, Any]]) -> str:
    gpus = [name.strip() for name in hardware.get("gpus", "none").split(",") if name.strip() and name.strip() != "none"]
    cuda_runtime = next((p["hardware"].get("cuda_runtime") for p in profiles if p["hardware"].get("cuda_runtime")), None)
    rows = [
        ("CPU model", hardware["cpu"]),
        ("vCPUs", hardware["cpu_count"]),
        ("GPU model", ", ".join(sorted(set(gpus))) or "none"),
        ("GPU count", str(len(gpus))),
        ("OS", f"{hardware['os']} ({hardware['machine']})"),
        ("Python", hardware["python"]),
        ("PyTorch", hardware["torch"]),
        ("torchvision", hardware["torchvision"]),
        ("CUDA (torch build)", hardware["torch_cuda_build"]),
        ("CUDA (runtime used)", cuda_runtime or "not used: no GPU profile"),
    ]
    return "| item | value |\n| --- | --- |\n" + "".join(f"| {name} | {value} |\n" for name, value in rows)


def analysis(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Plain sentences drawn from the comparison numbers."""
    sentences: list[str] = []
    by_series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_series.setdefault((row["device"], row["mode"]), []).append(row)
    for (device, mode), series in sorted(by_series.items()):
        series.sort(key=lambda row: row["batch_size"])
        largest, smallest = series[-1], series[0]
        sentences.append(
            f"**{device} {mode}**: at batch {largest['batch_size']} the top operator is `{largest['top_operator']}` "
            f"({largest['top_operator_share_pct']:.1f} % of the step) and convolution operators together take "
            f"{largest['convolution_share_pct']:.1f} % of it."
        )
        if len(series) > 1:
            ratio = smallest["per_sample_ms"] / largest["per_sample_ms"]
            sentences.append(
                f"Per-sample time falls from {smallest['per_sample_ms']:.4f} ms at batch {smallest['batch_size']} to "
                f"{largest['per_sample_ms']:.4f} ms at batch {largest['batch_size']} ({ratio:.1f}x cheaper): fixed "
                f"per-step costs (operator dispatch, {'the optimizer update, ' if mode == 'train' else ''}kernel "
                f"set-up) are shared by more samples, and at batch {smallest['batch_size']} the top operator is "
                f"`{smallest['top_operator']}`."
            )
    cpu = {(r["batch_size"], r["mode"]): r for r in rows if r["device"] == "cpu"}
    for row in rows:
        if row["device"] != "cpu" and (row["batch_size"], row["mode"]) in cpu:
            reference = cpu[(row["batch_size"], row["mode"])]
            sentences.append(
                f"{row['device']} vs cpu, batch {row['batch_size']} {row['mode']}: "
                f"{reference['step_time_ms'] / row['step_time_ms']:.1f}x the CPU's speed "
                f"({row['step_time_ms']:.3f} vs {reference['step_time_ms']:.3f} ms per step)."
            )
    if not any(row["device"] != "cpu" for row in rows):
        sentences.append("Only CPU combinations were profiled: add `cuda` to `profile.devices` on a GPU machine for the CPU vs GPU comparison.")
    return sentences


def embed_images(html: str, folder: Path) -> str:
    """Replace `src="figures/x.png"` with data URIs so the HTML file stands alone."""

    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(1)
        if not path.exists():
            return match.group(0)
        kind = "image/svg+xml" if path.suffix == ".svg" else "image/png"
        return f'src="data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    return re.sub(r'src="([^"]+)"', inline, html)


HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; }}
th {{ background: #f3f3f3; }}
code {{ background: #f6f6f6; padding: 0 0.2em; }}
img {{ max-width: 100%; }}
</style></head><body>
{body}
</body></html>
"""


def markdown_to_html(markdown_text: str, title: str, folder: Path) -> str:
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code"])
    return embed_images(HTML_TEMPLATE.format(title=title, body=body), folder)
