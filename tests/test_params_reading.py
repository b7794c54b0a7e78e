"""params.yaml read as DVC reads it (YAML 1.2, ruamel's safe loader), and an accepted value the stages cap said
once, by `validate`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from dvc.utils.serialize import parse_yaml

from pipeline.params.loading import load_params, read_params_file
from pipeline.params.validation import write_params_checked

# Scalars that YAML 1.1 (PyYAML) and 1.2 (ruamel, DVC) read differently, and some they agree on.
SCALARS = ["1e9", "1E-3", "2.5e+2", "yes", "no", "on", "off", "y", "010", "0o10", "0x1F", "1_000", "1:30", ".inf",
           "-.inf", ".nan", "~", "null", "True", "false", "2024-01-01", "+1", ".5", "1.", "'1e9'"]  # fmt: skip


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, float) and isinstance(theirs, float) and math.isnan(ours):
        return math.isnan(theirs)
    return type(ours) is type(theirs) and ours == theirs


def test_every_scalar_reads_as_dvc_reads_it(tmp_path: Path) -> None:
    text = "".join(f"k{index}: {scalar}\n" for index, scalar in enumerate(SCALARS))
    (tmp_path / "params.yaml").write_text(text)
    ours, theirs = read_params_file(tmp_path / "params.yaml"), parse_yaml(text, "params.yaml")
    differing = {SCALARS[int(key[1:])]: (ours[key], theirs[key]) for key in theirs if not _same(ours[key], theirs[key])}
    assert differing == {}


def test_an_exponent_without_a_dot_is_the_number_dvc_reads(
    tmp_path: Path, repo_params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = yaml.safe_dump(repo_params).replace(
        f"time_budget_s: {repo_params['profile']['time_budget_s']}", "time_budget_s: 1e3"
    )
    assert "time_budget_s: 1e3" in text
    (tmp_path / "params.yaml").write_text(text)
    assert load_params(tmp_path / "params.yaml").profile.time_budget_s == 1000.0
    assert parse_yaml(text, "params.yaml")["profile"]["time_budget_s"] == 1000.0


def test_aliases_and_duplicate_keys_are_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    for text, says in [("a: &x 1\nb: *x\n", "aliases (*x) are not allowed"), ("a: 1\na: 2\n", "appears twice")]:
        path.write_text(text)
        with pytest.raises(Exception, match=r"is not valid YAML") as raised:
            read_params_file(path)
        assert says in str(raised.value)


@pytest.mark.parametrize(("starts", "noted"), [(50, True), (6, False)])
def test_program_starts_above_the_processes_is_accepted_and_said_to_be_capped_once(
    tmp_path: Path,
    repo_params: dict[str, Any],
    starts: int,
    noted: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    repo_params["profile"].update(processes=6, program_starts=starts)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(repo_params))
    write_params_checked(tmp_path / "params.yaml", tmp_path / "params.ok", tmp_path / "fingerprint.json")
    stderr = capsys.readouterr().err
    note = (
        "note: `profile.program_starts` is 50, more than `profile.processes` (6): each profile stage starts 6, one "
        "per timing process. Set it to at most 6 in params.yaml to say what runs."
    )
    assert stderr.count(note) == (1 if noted else 0), stderr
    assert (tmp_path / "params.ok").is_file()
