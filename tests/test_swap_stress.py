"""SIGKILL in the middle of a real stage's output swap (pipeline.common.outputs: every old file moved aside, then every
new one moved in, `swap-<k>` the moment right after the k-th move): the next `python -m stages.validate` alone, and
the next `dvc repro`, leave the old or the new complete set byte for byte and say what they put back.

One tiny project reproduced for the module. Each case starts the stage as dvc.yaml's cmd does (`python -m
stages.<name>`, $DVC_STAGE set), holds it at `swap-<k>` ($LAB_PAUSE_AT), checks that the files in place are then the
mix that step leaves (as many outputs missing as the step implies), SIGKILLs its process group and waits until every
process working in the project is gone (≤ 10 s). Then, on its own kill each:

- `python -m stages.validate`: exit 0, one line naming the killed pid and the number of files it put back (step k
  has moved min(k + 1, old files) of them aside), the stage's outputs a complete set byte for byte, not a mix, and
  the old one, which that line says it put back (the swap's journal lives until its last new file is in place, so
  every step is undone), no temp folder left anywhere in the project;
- `dvc repro`: the same, exit 0, and no stage run but `validate`: the set put back is the one dvc.lock records.

A case that fails has the old set written back from the module's copy of it, so that the other steps still run.

The new set is what one unkilled run of the stage writes in a clone of the project (its swap has as many steps as
the old and new sets have files together, which the timeline, $LAB_TIMELINE, confirms). Run twice on the same
inputs, the report writes the same bytes, and so do train's checkpoint, metrics and curves, but not train's
`metrics/train_speed.json` (its speed) nor nearly any profile file (timings, traces, the comparisons and metrics
built on them): a file that differs between the reproduced run and the unkilled run is compared by name only, and
must differ from the old one (a mix would hold some old ones). So for the report, where old and new are the same
bytes, a half-done swap shows as missing or extra files; for profile@cpu the bytes tell old from new in nearly every
file.

Steps (tiny params: report 36, profile@cpu 126, train 10; each case is a stage run to its commit, about 10 s for the
report, 33 s for profile@cpu and 15 s for train on two cores): every step of the report through both paths. Every
step of profile@cpu and train through both would take over two hours, so train gets every step through `python -m
stages.validate`, while train through `dvc repro` and profile@cpu through both paths get the first and last steps,
the boundary between the two phases (the last move aside, the first move in) and one more step chosen by the commit
count (`git rev-list --count HEAD`, or $LAB_SWAP_ROTATION), a different one per path, so that consecutive commits
cover the rest in turn.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.projects import clone_project, processes_in, reproduced_copy, run_command, stage_environment
from tests.helpers.repo import REPO_ROOT
from tests.helpers.stress import Stderr

pytestmark = [pytest.mark.slow, pytest.mark.stress]  # `make test-stress`: minutes of stage runs


@dataclass(frozen=True)
class Stage:
    name: str  # as $LAB_PAUSE_AT names it: `python -m stages.<name>`
    target: str  # as DVC names it ($DVC_STAGE)
    outputs: tuple[str, ...]  # its files and folders in dvc.yaml; a folder's files at any depth


STAGES = {
    "report": Stage("report", "report", ("report", "plots/profile_comparison.csv")),
    "profile": Stage("profile", "profile@cpu", ("profiles/cpu", "traces/cpu", "metrics/profile_cpu.json")),
    "train": Stage(
        "train",
        "train",
        (
            "models/model.pt",
            "metrics/train.json",
            "metrics/train_speed.json",
            "plots/train_steps.csv",
            "plots/train_epochs.csv",
        ),
    ),
}
PATHS = ("validate", "dvc repro")
EVERY_STEP = {("report", "validate"), ("report", "dvc repro"), ("train", "validate")}
RESTORED = re.compile(
    r"a stage \(pid (?P<pid>\d+)\) was killed while it swapped its outputs in; put the previous set back, "
    r"(?P<count>\d+) file\(s\): (?P<names>.*)"
)


def rotation() -> int:
    """$LAB_SWAP_ROTATION, else the commit count: which of the other steps this run adds."""
    given = os.environ.get("LAB_SWAP_ROTATION", "").strip()
    if given:
        return int(given)
    counted = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return int(counted.stdout) if counted.returncode == 0 else 0


def chosen_steps(stage: str, path: str, aside: int, moved_in: int, turn: int) -> list[int]:
    """The steps a stage's swap is killed at through `path` (the module's docstring says which)."""
    every = list(range(aside + moved_in))
    if (stage, path) in EVERY_STEP:
        return every
    boundary = {0, aside - 1, aside, aside + moved_in - 1}
    rest = [step for step in every if step not in boundary]
    offset = 0 if path == PATHS[0] else len(rest) // 2
    return sorted(boundary | ({rest[(turn + offset) % len(rest)]} if rest else set()))


def output_files(project: Path, stage: Stage) -> dict[str, bytes]:
    """Every file of the stage's outputs, temp folders' files included, by its path in the project."""
    found = {}
    for relative in stage.outputs:
        path = project / relative
        files = sorted(item for item in path.rglob("*") if item.is_file()) if path.is_dir() else [path]
        found.update({str(file.relative_to(project)): file.read_bytes() for file in files if file.is_file()})
    return found


def visible(files: dict[str, bytes]) -> set[str]:
    """The outputs in place: no part of their path hidden (temp folders, backups)."""
    return {name for name in files if not any(part.startswith(".") for part in Path(name).parts)}


def temp_folders(project: Path) -> list[str]:
    return sorted(str(path.relative_to(project)) for path in project.rglob(".partial-*"))


@dataclass(frozen=True)
class Sets:
    """A stage's old set (the reproduced project's) and the new set of an unkilled run, by path in the project."""

    old: dict[str, bytes]
    new: dict[str, bytes]

    def which(self, files: dict[str, bytes]) -> str:
        """Which set `files` are: the old one byte for byte, the new one (its files that two runs write alike byte
        for byte, the others only unlike the old ones), or a mix."""
        if files == self.old:
            return "the old set"
        same = {name for name, data in self.new.items() if self.old.get(name) == data}
        if set(files) == set(self.new) and all(
            (files[name] == self.new[name]) if name in same else (files[name] != self.old.get(name)) for name in files
        ):
            return "the new set"
        changed = sorted(name for name in set(files) | set(self.old) if files.get(name) != self.old.get(name))
        return f"a mix (differing from the old set: {changed[:12]})"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    return reproduced_copy(tmp_path_factory.mktemp("swap-stress") / "project", mnist_mirror)


@pytest.fixture(scope="module")
def sets(project: Path, mnist_mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Sets]:
    """Each stage's old and new sets: the new one from an unkilled run in a clone, with its swap's steps counted."""
    found = {}
    for stage in STAGES.values():
        clone = clone_project(project, tmp_path_factory.mktemp(f"unkilled-{stage.name}") / "project")
        timeline = clone.parent / "timeline"
        ran = run_command(
            [sys.executable, "-m", f"stages.{stage.name}"],
            clone,
            stage_environment(mnist_mirror, {"DVC_STAGE": stage.target, "LAB_TIMELINE": str(timeline)}),
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        steps = [line.split()[1] for line in timeline.read_text().splitlines() if " swap-" in line]
        old, new = output_files(project, stage), output_files(clone, stage)
        # Every old file moved aside, every new one moved in: the swap's steps are the two sets' files.
        assert steps == [f"swap-{k}" for k in range(len(old) + len(new))], (len(old), len(new), steps)
        assert set(new) == set(old) == visible(old), sorted(set(new) ^ set(old))  # a rerun writes the same files
        found[stage.name] = Sets(old, new)
        shutil.rmtree(clone.parent)
    return found


def kill_at_swap_step(project: Path, mnist_mirror: Path, stage: Stage, sets: Sets, step: int) -> int:
    """The stage held right after its swap's move `step`, checked to be that mix, then SIGKILLed with its process
    group; returns its pid once every process working in the project is gone."""
    process = subprocess.Popen(
        [sys.executable, "-m", f"stages.{stage.name}"],
        cwd=project,
        env=stage_environment(mnist_mirror, {"DVC_STAGE": stage.target, "LAB_PAUSE_AT": f"{stage.name}:swap-{step}"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stderr = Stderr(process)
    stderr.wait_for_pause(f"swap-{step}", stage.name)
    in_place = visible(output_files(project, stage))
    aside = len(sets.old)
    missing = step + 1 if step < aside else 2 * aside - step - 1  # moved aside, less those moved in since
    signalled = time.monotonic()
    os.killpg(process.pid, signal.SIGKILL)
    text, _ = stderr.wait_all_gone(project, signalled)
    assert process.returncode == -signal.SIGKILL, text[-3000:]
    assert in_place <= set(sets.old) and len(set(sets.old) - in_place) == missing, (step, set(sets.old) - in_place)
    return process.pid


def check_put_back(project: Path, stage: Stage, sets: Sets, step: int, pid: int, said: str) -> None:
    """One line about the killed stage's swap, naming its pid and the files put back, and a complete set."""
    lines = [found for found in (RESTORED.search(line) for line in said.splitlines()) if found]
    assert len(lines) == 1, said[-3000:]
    assert int(lines[0]["pid"]) == pid, said[-3000:]
    assert int(lines[0]["count"]) == min(step + 1, len(sets.old)), said[-3000:]  # each old file moved aside so far
    names = lines[0]["names"].removesuffix(".").removesuffix(" ...").split(", ")
    assert len(names) == min(int(lines[0]["count"]), 6) and set(names) <= set(sets.old), names
    state = sets.which(output_files(project, stage))
    assert state == "the old set", f"after the kill at swap-{step}: {state}, where it says it put the old set back"
    assert temp_folders(project) == []


def restore_old(project: Path, stage: Stage, sets: Sets) -> None:
    """The old set back as it was, for the next case, where a case failed to put it back."""
    for name in output_files(project, stage).keys() - sets.old.keys():
        (project / name).unlink()
    for name, data in sets.old.items():
        path = project / name
        if not path.is_file() or path.read_bytes() != data:
            path.unlink(missing_ok=True)  # never written through: a cached output may share DVC's cache file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for folder in temp_folders(project):
        shutil.rmtree(project / folder, ignore_errors=True)


@pytest.mark.parametrize(
    ("stage_name", "path"),
    [pytest.param(stage, path, id=f"{stage}-{path.replace(' ', '-')}") for stage in STAGES for path in PATHS],
)
def test_a_stage_killed_at_a_swap_step_is_put_back_by_the_next_start(
    project: Path, mnist_mirror: Path, sets: dict[str, Sets], stage_name: str, path: str
) -> None:
    stage, found = STAGES[stage_name], sets[stage_name]
    environment = stage_environment(mnist_mirror)
    failures = []
    steps = chosen_steps(stage_name, path, len(found.old), len(found.new), rotation())
    for step in steps:
        try:
            pid = kill_at_swap_step(project, mnist_mirror, stage, found, step)
            if path == "validate":
                ran = run_command([sys.executable, "-m", "stages.validate"], project, environment)
                said = ran.stderr
            else:
                ran = run_command(["dvc", "repro"], project, environment)
                said = ran.stdout + ran.stderr
                assert re.findall(r"Running stage '([^']+)'", ran.stdout) == ["validate"], ran.stdout[-3000:]
            assert ran.returncode == 0, said[-3000:]
            check_put_back(project, stage, found, step, pid, said)
        except (AssertionError, pytest.fail.Exception) as error:  # the other steps still tell which fail
            failures.append(f"swap-{step}: {error}")
            restore_old(project, stage, found)
        assert processes_in(project) == []
    assert failures == [], f"{len(failures)} of steps {steps} failed:\n" + "\n".join(failures)
