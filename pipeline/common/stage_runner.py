"""Entry-point wrapper shared by every stage script: user errors, Ctrl-C and SIGTERM become exit codes."""

from __future__ import annotations

import atexit
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.common.interrupts import (
    Terminated,
    deferred_signal,
    exit_at_further_signal,
    install_handlers,
    note_moment,
    past_commit_point,
    pause_at,
    raise_swallowed,
    shielded,
)
from pipeline.common.outputs import (
    check_output_folder,
    sweep_stale_partials,
    undo_interrupted_swaps,
    write_error_message,
)
from pipeline.common.paths import ALL_OUTPUT_FOLDERS, NESTED_OUTPUT_FOLDERS, STAGE_OUTPUT_FOLDERS

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT: 128 + 2
EXIT_TERMINATED = 143  # 128 + SIGTERM (15), what `timeout`, schedulers and container stops send
_SIGNAL_EXITS: dict[int, int] = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}
# Environment problems the user fixes (full disk, quota, read-only or forbidden folder), not bugs.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def run_stage(name: str, main: Callable[[], None]) -> None:
    """Run a stage's `main`, exiting non-zero with a readable message on user errors, Ctrl-C or SIGTERM.

    Before `main`, the stage's output folders are checked (writable, room left) and temp folders
    left by killed runs are removed from every stage's output folders (`sweep_killed_runs`). Every message
    passes through `redact`: no URL password is printed. Programming errors keep their traceback on purpose:
    those are bugs to report, not inputs to fix.
    """
    # SIGINT: Python's own KeyboardInterrupt, which it installs only where SIGINT was not ignored at start-up.
    # A stage started as a background job of a non-interactive shell (`dvc repro &` in a script) inherits it
    # ignored and so keeps ignoring it, as POSIX tools do: a Ctrl-C meant for the foreground job must not stop
    # it. SIGTERM always stops a stage (kill, timeout, schedulers, container stops). stages/__init__.py installs
    # the same before the stage's imports; pipeline.common.interrupts says what changes at the commit point.
    install_handlers(name)
    try:
        pause_at("imported")
        prepare_output_folders(name)
        main()
        note_moment("main-returned")
        raise_swallowed()  # a stop whose exception a finalizer or callback dropped still ends the stage
    except PipelineError as error:
        print(redact(f"\nerror in stage '{name}': {error}"), file=sys.stderr)
        exit_at_further_signal(EXIT_USER_ERROR, _SIGNAL_EXITS)
        sys.exit(EXIT_USER_ERROR)
    except OSError as error:
        if error.errno not in _WRITE_ERRNOS:
            raise
        folders = (*STAGE_OUTPUT_FOLDERS.get(name, ()), Path("mlartifacts"), Path("runs"))
        message = write_error_message(error, folders=folders)
        written = (
            "Its outputs had already been committed (complete), but its run is FAILED: run the stage again."
            if past_commit_point()
            else "No outputs were written."
        )
        print(redact(f"\nerror in stage '{name}': {message} {written}"), file=sys.stderr)
        exit_at_further_signal(EXIT_USER_ERROR, _SIGNAL_EXITS)
        sys.exit(EXIT_USER_ERROR)
    except Terminated:
        with shielded():  # a second signal while saying so would end the stage with a traceback
            print(f"\nstage '{name}' terminated (SIGTERM); {_what_was_written()}", file=sys.stderr)
            exit_at_further_signal(EXIT_TERMINATED, _SIGNAL_EXITS)
            sys.exit(EXIT_TERMINATED)
    except KeyboardInterrupt:
        with shielded():
            print(f"\nstage '{name}' interrupted; {_what_was_written()}", file=sys.stderr)
            exit_at_further_signal(EXIT_INTERRUPTED, _SIGNAL_EXITS)
            sys.exit(EXIT_INTERRUPTED)
    late = deferred_signal()
    if late is not None:
        # It came after the commit point: the stage finished, and stops the pipeline all the same.
        print(
            f"\nstage '{name}' received {signal.Signals(late).name} after its outputs were committed: they are "
            "complete and its run ended; stopping here (the next `dvc repro` reruns it).",
            file=sys.stderr,
        )
        exit_at_further_signal(_SIGNAL_EXITS[late], _SIGNAL_EXITS)
        sys.exit(_SIGNAL_EXITS[late])
    exit_at_further_signal(None, _SIGNAL_EXITS)  # done: a stop from here on still makes the exit non-zero


def run_stage_process(name: str, main: Callable[[], None]) -> NoReturn:
    """`run_stage` as a stage script's whole process: once it returns, the process ends as the interpreter would end
    it (`leave`), without its teardown."""
    run_stage(name, main)
    leave(0)


def leave(code: int) -> NoReturn:
    """End the process with `code` as the interpreter's exit would, minus its teardown: other threads are joined, the
    atexit callbacks run (MLflow's, logging's) and stdout and stderr flushed, then `os._exit`. The teardown frees
    every module and object one by one, torch's and MLflow's too: 1-2.6 s of a stage process after its work
    (docs/measurements.md), with nothing left to write, since every output is committed and every run ended."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _what_was_written() -> str:
    # A second signal after the commit point stops the stage at once (pipeline.common.interrupts): by then its
    # outputs are in place, and only the run's end may be left undone.
    if deferred_signal() is None:
        return "no outputs were written."
    return "its outputs were already committed (complete); its MLflow run may not have been ended."


def prepare_output_folders(stage: str, root: Path = Path(".")) -> None:
    """Remove dead runs' temp folders from every stage's output folders, then check that the stage's own can take
    outputs."""
    sweep_killed_runs(root)
    for folder in STAGE_OUTPUT_FOLDERS.get(stage, ()):
        check_output_folder(root / folder)


def sweep_killed_runs(root: Path = Path(".")) -> list[Path]:
    """Undo the output swaps that dead processes left half done (saying so), then remove the temp folders that dead
    processes left in any stage's output folders; return them.

    Every stage sweeps every stage's folders, not only its own: a stage killed while writing leaves its outputs as
    they were, so the next `dvc repro` may well not rerun it (a killed download left data/MNIST complete and
    unchanged) and only another stage is there to remove what it left; `validate` starts first in every
    `dvc repro`. A folder is removed only when no process has the pid in its name
    (pipeline.common.processes.pid_alive): a pid reused since by an unrelated process keeps it until that process
    ends too — a leftover kept a while longer, never a live run's folder removed. It runs at every stage start, so
    it stays cheap: a listing of each folder and of each of its sub-folders (sweep_stale_partials), no deeper
    (under a millisecond for a full project).
    """
    folders = [(root / folder, 2 if folder in NESTED_OUTPUT_FOLDERS else 1) for folder in ALL_OUTPUT_FOLDERS]
    for folder, depth in folders:  # first: a killed swap's backups may hold the only copy of an output
        for line in undo_interrupted_swaps([folder], depth):
            print(f"{line}.", file=sys.stderr)
    removed: list[Path] = []
    for folder, depth in folders:
        removed += sweep_stale_partials(folder, depth)
    return removed
