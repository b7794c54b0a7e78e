"""All-or-nothing outputs: write every file of a stage to a temp folder, rename them all at the end.

A stage that fails or is interrupted before `commit()` leaves none of its outputs behind, so DVC
never sees a half-written checkpoint or a metrics file from a run that did not finish. `commit()`
itself is all-or-nothing too: if one rename fails (a file made immutable, a read-only mount), the
files already replaced are put back, so the outputs are either all new or all as before.

A process killed with SIGKILL (or an OOM kill, or a power cut) cannot clean up. Before its first rename `commit()`
writes a journal (`swap-journal.json` in its first temp folder, synced to disk) naming every file it will move and
where each old version waits; it removes the journal only once every new file is in place. The next stage to start,
whichever it is, finds the journal of a dead process first (`undo_interrupted_swaps`) and puts the old set back,
file by file, saying so; only then does `sweep_stale_partials` remove the dead processes' temp folders (any stage
sweeps every stage's output folders, since the stage that was killed may not be rerun). So a stop at any moment of
the swap leaves the old complete set or the new complete set, never a mix, and no backup is swept while it holds
the only copy of an output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from pipeline.common.errors import PipelineError
from pipeline.common.interrupts import enter_commit_point, pause_at
from pipeline.common.processes import pid_alive

PARTIAL_PREFIX = ".partial-"
# `.partial-<pid>` (AtomicOutputs) and `.<name>.partial-<pid>-<random>` / `.<name>.old-<pid>-<random>`
# (whole folders replaced at once, pipeline.data.mnist): the pid says whose it is.
_STALE_NAME = re.compile(r"^(?:\.partial-|\.[^/]+\.(?:partial|old)-)(?P<pid>\d+)(?:-[^/]*)?$")


def partial_folder(final: Path, pid: int | None = None) -> Path:
    return Path(final).parent / f"{PARTIAL_PREFIX}{os.getpid() if pid is None else pid}"


# Flushes run at the start of every commit (`flushed_before_commit`): the open tracker's, so that what a stage logged
# reaches the disk (TensorBoard's buffered events) and the store before its outputs move. Each is given the commit's
# files, {final path: staged file}, so the tracker can record what its run is about to put in place.
BeforeCommit = Callable[[Mapping[Path, Path]], None]
_BEFORE_COMMIT: list[BeforeCommit] = []


@contextlib.contextmanager
def flushed_before_commit(flush: BeforeCommit) -> Iterator[None]:
    """While open, `flush` runs first in every `AtomicOutputs.commit`: a full disk under `runs/` or a store that
    stopped answering then fails the stage with its outputs unchanged, instead of after they were renamed into
    place, and "no outputs were written" stays true."""
    _BEFORE_COMMIT.append(flush)
    try:
        yield
    finally:
        _BEFORE_COMMIT.remove(flush)


class AtomicOutputs:
    """Use as a context manager: `staged(path)` gives a temp path; a clean exit renames them all.

    A staged file keeps its final name, inside a hidden `.partial-<pid>` folder beside its final
    place (same file system, so the rename is atomic), so it can be logged as an artifact under its
    real name before the outputs are committed.
    """

    def __init__(self) -> None:
        self._staged: dict[Path, Path] = {}
        self._owned: list[Path] = []
        self._aside: set[Path] = set()  # where stale files wait for the end of the commit

    def staged(self, final: Path) -> Path:
        final = Path(final)
        folder = partial_folder(final)
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / final.name
        self._staged[final] = temporary
        return temporary

    def write_text(self, final: Path, text: str) -> None:
        try:
            self.staged(final).write_text(text)
        except OSError as error:  # disk full, quota, read-only: say which output, not just errno
            raise PipelineError(f"{write_error_message(error, final)} Nothing was written.") from None

    def write_bytes(self, final: Path, data: bytes) -> None:
        try:
            self.staged(final).write_bytes(data)
        except OSError as error:  # disk full, quota, read-only: say which output, not just errno
            raise PipelineError(f"{write_error_message(error, final)} Nothing was written.") from None

    def own(self, folder: Path) -> None:
        """This stage writes the whole of `folder`: at the commit, files in it (at any depth) that the commit does
        not write are removed with the old set, so a direct run leaves no stale file its new outputs no longer
        hold (`dvc repro` removes them before the stage runs). Removing is part of the all-or-nothing commit."""
        self._owned.append(Path(folder))

    def write_json(self, final: Path, payload: Any) -> None:
        self.write_text(final, json.dumps(payload, indent=2, sort_keys=True) + "\n")

    def commit(self) -> None:
        """Rename every staged file into place; on any failure restore what was there before. The stage's commit
        point (pipeline.common.interrupts): a signal that arrived before it stops the stage here, a later one
        once the stage is done."""
        try:
            for flush in list(_BEFORE_COMMIT):
                flush(dict(self._staged))
            pause_at("commit")
            enter_commit_point()
            stale = self._stale_files()
            self._aside = {partial_folder(path) for path in stale}
            _replace_all(self._staged, stale)
        finally:
            self._remove_folders()

    def _stale_files(self) -> list[Path]:
        """The files in the owned folders that this commit does not write; temp folders (ours, other runs') aside."""
        written = set(self._staged)
        found = []
        for folder in self._owned:
            for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
                hidden = any(part.startswith(PARTIAL_PREFIX) or _STALE_NAME.match(part) for part in path.parts)
                if not hidden and (path.is_file() or path.is_symlink()) and path not in written:
                    found.append(path)
        return found

    def discard(self) -> None:
        self._remove_folders()

    def _remove_folders(self) -> None:
        for folder in {temporary.parent for temporary in self._staged.values()} | self._aside:
            shutil.rmtree(folder, ignore_errors=True)
        self._staged.clear()
        self._aside.clear()

    def __enter__(self) -> AtomicOutputs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


JOURNAL_NAME = "swap-journal.json"


@dataclasses.dataclass(frozen=True)
class _Move:
    """One file of a swap: its final place, the staged new file (None: a stale file that nothing replaces) and where
    its old version waits during the swap (None: it had none)."""

    final: Path
    staged: Path | None
    backup: Path | None


def _plan(staged: dict[Path, Path], stale: Sequence[Path]) -> list[_Move]:
    moves = []
    for index, (final, temporary) in enumerate(staged.items()):
        exists = final.exists() or final.is_symlink()
        moves.append(_Move(final, temporary, temporary.parent / f".old-{index}-{final.name}" if exists else None))
    for index, final in enumerate(stale):
        moves.append(_Move(final, None, partial_folder(final) / f".stale-{index}-{final.name}"))
    return moves


def _synced(path: Path) -> None:
    """Flush `path` (a file or a folder) to the disk: what a power cut must not lose."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_journal(journal: Path, moves: Sequence[_Move]) -> None:
    """The swap's plan, with every path relative to the journal's folder (a project moved after a kill still finds
    its files), written and synced before the first rename."""

    def relative(path: Path | None) -> str | None:
        return None if path is None else os.path.relpath(path.absolute(), journal.parent.absolute())

    entries = [{"final": relative(m.final), "staged": relative(m.staged), "backup": relative(m.backup)} for m in moves]
    partial = journal.with_name(journal.name + ".writing")
    partial.write_text(json.dumps({"format": 1, "moves": entries}, indent=1))
    _synced(partial)
    os.replace(partial, journal)
    _synced(journal.parent)


def _replace_all(staged: dict[Path, Path], stale: Sequence[Path] = ()) -> None:
    """Two phases, each undone on failure: move the old finals (and the `stale` files, which nothing replaces)
    aside, then the new files in; before the first rename a journal names every move, so that a process killed
    mid-swap is undone by the next stage (`undo_interrupted_swaps`).

    Moving an old file aside is the step an immutable file or a read-only mount refuses, so most
    failures happen before any output changed; a failure in the second phase moves the new files
    out again and the old ones back.
    """
    moves = _plan(staged, stale)
    if not moves:
        return
    for temporary in staged.values():
        _synced(temporary)  # the new files' contents reach the disk before any name points at them
    journal = next(iter(staged.values())).parent / JOURNAL_NAME if staged else partial_folder(stale[0]) / JOURNAL_NAME
    journal.parent.mkdir(exist_ok=True)
    for move in moves:
        if move.staged is None and move.backup is not None:
            move.backup.parent.mkdir(exist_ok=True)
    current: Path | None = None
    try:
        _write_journal(journal, moves)
        renames = [(m.final, m.final, m.backup) for m in moves if m.backup is not None]
        renames += [(m.final, m.staged, m.final) for m in moves if m.staged is not None]
        for step, (final, source, target) in enumerate(renames):
            current = final
            os.replace(source, target)
            pause_at(f"swap-{step}")  # a stress test's moment: right after the swap's `step`th rename
        for folder in {move.final.parent for move in moves}:
            _synced(folder)
        journal.unlink()
    except OSError as error:
        _undo(moves)
        journal.unlink(missing_ok=True)
        raise PipelineError(
            f"could not replace {current} ({error.strerror}); every output of this stage was left as it was "
            f"before. Make {current} replaceable (`lsattr`/`chattr -i`, a read-only mount, permissions) and run again."
        ) from None


def _undo(moves: Sequence[_Move]) -> list[Path]:
    """Put every file of a swap back as it was before it, whatever step it reached; return the finals restored or
    removed. Each step only moves what is where the swap left it, so undoing twice (a kill during the undo) is
    safe."""
    restored = []
    for move in reversed(moves):
        placed = move.staged is not None and not move.staged.exists() and move.final.exists()
        if move.backup is not None and move.backup.exists():
            os.replace(move.backup, move.final)  # the old version back, over the new one where it was placed
            restored.append(move.final)
        elif placed and move.backup is None:
            move.final.unlink()  # a new file where there was none
            restored.append(move.final)
    return restored


def undo_interrupted_swaps(folders: Sequence[Path], depth: int = 1) -> list[str]:
    """Undo the swaps that dead processes left half done in `folders` (and `depth` levels of sub-folders): every
    file back as it was before the swap (`_undo`), then the journal removed. Returns one line per swap undone, for
    the console. Call before `sweep_stale_partials`, which would remove the backups."""
    said = []
    for folder in folders:
        for partial, pid in _dead_partials(folder, depth):
            journal = partial / JOURNAL_NAME
            if not journal.is_file():
                continue

            def resolved(relative: str | None, base: Path = partial) -> Path | None:
                return None if relative is None else Path(os.path.normpath(base / relative))

            moves = [
                _Move(Path(os.path.normpath(partial / m["final"])), resolved(m["staged"]), resolved(m["backup"]))
                for m in json.loads(journal.read_text())["moves"]
            ]
            restored = _undo(moves)
            journal.unlink()
            if restored:
                names = ", ".join(str(path) for path in restored[:6]) + (" ..." if len(restored) > 6 else "")
                said.append(
                    f"a stage (pid {pid}) was killed while it swapped its outputs in; put the previous set back, "
                    f"{len(restored)} file(s): {names}"
                )
    return said


def _dead_partials(folder: Path, depth: int) -> list[tuple[Path, int]]:
    """The temp folders in `folder` and `depth` levels of its sub-folders whose process is gone, with its pid. A
    listing of those folders, no deeper, so that it stays cheap however large the outputs are. A reused pid counts as
    alive (pipeline.common.processes.pid_alive): its folder waits for a later stage."""
    if not folder.is_dir():
        return []
    found = []
    for candidate in [path for level in range(depth + 1) for path in folder.glob("*/" * level + ".*")]:
        match = _STALE_NAME.match(candidate.name)
        if match and candidate.is_dir() and not candidate.is_symlink() and not pid_alive(int(match["pid"])):
            found.append((candidate, int(match["pid"])))
    return found


def sweep_stale_partials(folder: Path, depth: int = 1) -> list[Path]:
    """Remove the temp folders that dead processes left in `folder` and its sub-folders; return them.

    `depth` levels of sub-folders are searched too (2 for outputs like `profiles/<device>/<batch>-<mode>/`); no
    deeper, so that the cost stays a listing of a few folders however large the outputs are. Dead means no process
    has the pid in the name; a reused pid counts as alive (pipeline.common.processes.pid_alive): the folder waits
    for a later sweep.
    """
    removed = []
    for candidate, _ in _dead_partials(folder, depth):
        shutil.rmtree(candidate, ignore_errors=True)
        removed.append(candidate)
    return removed


# Below this much free space a stage does not start: every output of one stage is smaller (the data
# set, the largest, is ~55 MB), and a nearly full disk fails halfway otherwise.
MIN_FREE_BYTES = 64 << 20


def check_output_folder(folder: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """`folder` exists (created if needed), accepts a new file, and has `min_free` bytes free."""
    fix = "Nothing was run."
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise PipelineError(
            f"cannot write into {folder}/ ({error.strerror}): {_access_fix(error, folder)} {fix}"
        ) from None
    free = shutil.disk_usage(folder).free
    if free < min_free:
        raise PipelineError(
            f"{folder}/ has only {size_text(free)} free on its file system; this stage needs at least "
            f"{size_text(min_free)} "
            f"there for its outputs. Free space on the file system holding {folder}/ and run again. {fix}"
        )


def write_error_message(error: OSError, path: Path | str | None = None, folders: Sequence[Path] = ()) -> str:
    """One paragraph for an OSError met while writing outputs: which path, what happened, the fix.

    A failed write() names no file; then the `folders` the stage writes into are checked, and the
    full ones named.
    """
    reason = error.strerror or str(error)
    where = path if path is not None else error.filename
    if where is not None:
        return f"could not write {where} ({reason}): {_access_fix(error, Path(str(where)).parent)}"
    full = [(folder, shutil.disk_usage(folder).free) for folder in folders if folder.is_dir()]
    full = [(folder, free) for folder, free in full if free < MIN_FREE_BYTES]
    if full:
        listing = "; ".join(f"{folder}/ has only {size_text(free)} free" for folder, free in full)
        return f"could not write ({reason}): {listing}. Free space there and run again."
    shown = ", ".join(f"{folder}/" for folder in folders) or "the output folders"
    return f"could not write an output ({reason}): check free space and permissions of {shown} and run again."


def _access_fix(error: OSError, folder: Path) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the file system holding {folder}/ is full (or over quota); free space there and run again."
    if error.errno == errno.EROFS:
        return f"{folder}/ is on a read-only file system; remount it writable or run the project elsewhere."
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"make {folder}/ writable for this user (permissions, `chattr -i`) and run again."
    return "check the path and run again."


def size_text(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} PiB"
