"""A stage killed with SIGKILL at any step of its output swap (pipeline.common.outputs): the next stage start puts the
previous complete set back, byte for byte, and says so; nothing it needs is swept first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.common.outputs import JOURNAL_NAME, AtomicOutputs
from pipeline.common.stage_runner import sweep_killed_runs
from tests.helpers.repo import REPO_ROOT

OLD = {"report/report.md": b"old report\n", "report/figures/a.png": b"old a", "report/gone.txt": b"dropped by the new"}
NEW = {"report/report.md": b"new report\n", "report/figures/a.png": b"new a", "report/figures/b.png": b"new b"}
# The swap's steps: each old final moved aside (report.md, a.png, and gone.txt, which the new set no longer has),
# then each new file moved in (report.md, a.png, b.png); a step `swap-k` is the moment right after the k-th move.
MOVES = 6
SWAP = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pipeline.common.interrupts import install_handlers
    from pipeline.common.outputs import AtomicOutputs
    install_handlers("report")
    with AtomicOutputs() as outputs:
        outputs.own(Path("report"))
        for name, data in json.loads(sys.argv[1]).items():
            outputs.write_bytes(Path(name), data.encode())
    """
)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted((root / "report").rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    }


def _write(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def _killed_at(root: Path, step: int) -> None:
    """The swap of NEW over OLD in a process of its own, SIGKILLed at the moment right after move `step`."""
    environment = {**os.environ, "LAB_PAUSE_AT": f"report:swap-{step}", "PYTHONPATH": str(REPO_ROOT)}
    payload = json.dumps({name: data.decode() for name, data in NEW.items()})
    process = subprocess.Popen(
        [sys.executable, "-c", SWAP, payload], cwd=root, env=environment, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    line = process.stderr.readline()
    assert f"[paused at report:swap-{step}]" in line, line + process.stderr.read()
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.parametrize("step", range(MOVES))
def test_a_swap_killed_at_any_step_is_undone_by_the_next_stage_start_saying_so(
    tmp_path: Path, step: int, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, OLD)
    _killed_at(tmp_path, step)
    assert list(tmp_path.glob(f"report/.partial-*/{JOURNAL_NAME}")), "the swap left no journal"
    if step < MOVES - 1:
        assert _files(tmp_path) != OLD  # the kill left a mix: the next stage must mend it
    swept = sweep_killed_runs(tmp_path)
    assert _files(tmp_path) == OLD
    said = capsys.readouterr().err
    assert "was killed while it swapped its outputs in; put the previous set back" in said, said
    assert swept and not list(tmp_path.glob("report/**/.partial-*"))  # then, and only then, its temp folders go
    assert sweep_killed_runs(tmp_path) == [] and capsys.readouterr().err == ""  # once


def test_a_swap_that_finished_leaves_no_journal_and_the_new_set(tmp_path: Path) -> None:
    _write(tmp_path, OLD)
    with AtomicOutputs() as outputs:
        outputs.own(tmp_path / "report")
        for name, data in NEW.items():
            outputs.write_bytes(tmp_path / name, data)
    assert _files(tmp_path) == NEW
    assert not list(tmp_path.glob("report/**/.partial-*"))


def test_a_swap_killed_before_its_first_move_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed right after the journal was written, before any file moved: the old set is whole; nothing to say."""
    _write(tmp_path, OLD)
    os.makedirs(tmp_path / "report" / ".partial-999999999")
    (tmp_path / "report" / ".partial-999999999" / "report.md").write_bytes(NEW["report/report.md"])
    journal = tmp_path / "report" / ".partial-999999999" / JOURNAL_NAME
    journal.write_text(
        json.dumps(
            {"format": 1, "moves": [{"final": "../report.md", "staged": "report.md", "backup": ".old-0-report.md"}]}
        )
    )
    sweep_killed_runs(tmp_path)
    assert _files(tmp_path) == OLD and capsys.readouterr().err == ""
