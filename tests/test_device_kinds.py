"""Device kinds, each in one place (pipeline/devices/): the registry, what each kind says, and a stand-in kind added
as one file that goes through validate, roofs, the profile stage, the report and both hand-ins."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.devices.registry import device_kind, device_kinds, device_names, host_kind, kind_of
from tests.helpers.projects import clone_project, read_params, run_command, stage_environment, write_params
from tests.helpers.repo import REPO_ROOT

# A device kind named in quotes, as code that branches on a device's name would.
QUOTED_KIND = re.compile(r"""["'](?:cpu|cuda|mps|xpu)["']""")
MOST_QUOTED_LINES = 10  # outside pipeline/devices/ and pipeline/params/ (docs/extending.md, "A new device kind")


def test_the_kinds_are_found_by_listing_their_folder() -> None:
    assert device_names() == ("cpu", "cuda", "mps")
    assert host_kind().name == "cpu" and host_kind().on_host
    assert [kind.name for kind in device_kinds().values() if kind.support == "tested"] == ["cpu", "cuda"]
    assert device_kind("mps").support == "untested"
    assert kind_of("cuda").allocated_size(1) == 512 and kind_of("cpu").allocated_size(1) == 1
    assert device_kind("cuda").energy_source(1) == ("gpu:1", "")
    assert device_kind("xpu").colour == "tab:gray" and not device_kind("xpu").on_host  # a record from elsewhere


def test_few_lines_outside_the_device_kinds_name_one() -> None:
    """What differs between devices is asked of their kinds: code elsewhere names a device kind in quotes only where
    a library's own rule does (MLflow's serving device, the pytorch/examples recipe's CUDA settings)."""
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for folder in ("pipeline", "stages", "benchmarks")
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        if not path.is_relative_to(REPO_ROOT / "pipeline/devices")
        and not path.is_relative_to(REPO_ROOT / "pipeline/params")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if QUOTED_KIND.search(line)
    ]
    assert len(found) <= MOST_QUOTED_LINES, "\n".join(found)


STAND_IN = '''"""A stand-in device kind: the host's CPU under another name, with its own colour and words."""

import dataclasses

from pipeline.devices.cpu import KIND as CPU

KIND = dataclasses.replace(
    CPU, name="host", colour="tab:orange", support="untested", auto_rank=None,
    names={"en": "Host CPU", "zh": "主机 CPU"},
)
'''


@pytest.mark.slow
def test_a_kind_added_as_one_file_goes_through_validate_profile_report_and_handin(
    reproduced_project: Path, tmp_path: Path, mnist_mirror: Path
) -> None:
    """A new kind is one module in pipeline/devices/: params.yaml may then name it, and its profile stage, the roofs,
    the report and both hand-ins treat it as any other device, with no edit anywhere else."""
    project = clone_project(reproduced_project, tmp_path / "project")
    (project / "pipeline/devices/host.py").write_text(STAND_IN)
    params = read_params(project)
    params["profile"]["devices"] = ["cpu", "host"]
    # Two combinations and no drift probe: what is checked is that the kind goes through, not its timing.
    params["profile"].update(batch_sizes=[1, 16], modes=["inference"], drift_probe_s=0)
    params["report"]["languages"] = ["zh", "en"]
    write_params(project, params)
    env = stage_environment(mnist_mirror)
    result = run_command(["dvc", "repro", "-s", "validate", "roofs", "profile@host", "report"], project, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "device kind `host` is defined (pipeline/devices/) but not tested by this project" in result.stderr

    roofs = json.loads((project / "hardware/roofs.json").read_text())
    assert sorted(device["device"] for device in roofs["devices"]) == ["cpu", "host"]
    records = sorted((project / "profiles/host").glob("*/profile.json"))
    wanted = len(params["profile"]["batch_sizes"]) * len(params["profile"]["modes"])
    assert len(records) == wanted
    for path in records:
        record = json.loads(path.read_text())
        assert record["combination"]["device"] == "host"
        assert record["timing"]["per_sample_ms"] > 0
    ratios = json.loads((project / "metrics/profile_host.json").read_text())  # the paired comparisons of its stage
    assert ratios and all(re.fullmatch(r"\d+-host-\w+ / \d+-host-\w+", name) for name in ratios)

    report = (project / "report/report.md").read_text()
    for batch in params["profile"]["batch_sizes"]:
        for mode in params["profile"]["modes"]:
            assert f"| {batch} | host | {mode} |" in report and f"| {batch} | cpu | {mode} |" in report
    assert "| Host CPU inference |" in (project / "report/handin.en.md").read_text()  # a row of section 2
    assert "主机 CPU" in (project / "report/handin.zh.md").read_text()
