"""How a stage takes Ctrl-C (SIGINT) and SIGTERM: before its commit point as an interruption that leaves nothing
behind, from its commit point on as a request to stop once the stage is done.

Before the commit point SIGINT raises KeyboardInterrupt (Python's own handler) and SIGTERM raises `Terminated`, so
every cleanup path runs: temp outputs discarded, the MLflow run ended KILLED, exit 130 or 143
(pipeline.common.stage_runner). A stage started with SIGINT ignored (a background job of a non-interactive shell)
keeps ignoring it, as POSIX tools do; SIGTERM always stops it.

Raising is not enough on its own: Python runs a signal's handler wherever the main thread is, and an exception
raised inside a finalizer (`__del__`, a weakref callback such as WeakKeyDictionary's) or some library callbacks is
printed ("Exception ignored in: ...") and dropped, and the stage would go on to finish. So the handler also records
every signal, and the stage checks the record where it matters (`raise_swallowed`): at its commit point before any
rename, when its MLflow run would end FINISHED, and when its `main` returns. A signal seen before the commit point
stops the stage there, whether its exception arrived or not. The cleanup a signal starts (the run's end) is
`shielded`: one more signal meanwhile is recorded and the cleanup finishes; a further one stops it at once. Once the
stage is over (its outcome said, its exit code chosen), a signal ends the process at once (`exit_at_further_signal`):
only the interpreter's shutdown is left, whose atexit callbacks would print and drop a raised exception.

The commit point is the moment before a stage's first output is renamed into place (`enter_commit_point`,
called by pipeline.common.outputs.AtomicOutputs.commit and the data set's folder swap). A signal that arrived
before it is raised there, before anything moved. From there on an exception would cut the renames, or the
run's end, in half: outputs new but the run KILLED, or half the outputs new. So a signal is only recorded, the
stage finishes (outputs in place, run FINISHED), and then exits 130 or 143 all the same, so that `dvc repro`
stops after it (DVC records no lock entry for it and reruns it next time). A second signal stops it at once: a
tracking store that hangs at the run's end must not trap the user.

`pause_at` holds a stage at a named moment of its life while $LAB_PAUSE_AT names it (`train:commit`), so that a
test can deliver a signal at that exact point through the real paths (the stage alone, `dvc repro`'s process group,
`dvc queue kill`); unset, it costs one string comparison. Inside `dvc exp run`, $LAB_PAUSE_PLAN may name a JSON file
mapping experiment names ($DVC_EXP_NAME) to such moments, so that one queue worker can run experiments that each
pause somewhere else.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

PAUSE_VARIABLE = "LAB_PAUSE_AT"
FAIL_VARIABLE = "LAB_FAIL_AT"  # "<stage>:<moment>": raise InjectedFailure there instead of pausing (tests only)
PAUSE_LIMIT_S = 300.0  # a paused stage nobody signals goes on after this
PLAN_VARIABLE = "LAB_PAUSE_PLAN"
# A file that each stage appends `<stage> <moment> <seconds since its process started>` to at every `pause_at` moment
# (benchmarks.stage_costs reads it): where a stage's time goes, measured from the kernel's record of the start.
TIMELINE_VARIABLE = "LAB_TIMELINE"
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # signals received before the commit point, in order
_deferred: list[int] = []  # signals received after the commit point, in order
_shielded: list[int] = []  # signals received inside `shielded`, in order
_shield_depth = 0
_committing = False
_pause_at = ""  # "<stage>:<moment>", set by install_handlers
_fail_at = ""  # likewise
_stage_name = ""  # the stage this process runs, set by install_handlers


class InjectedFailure(RuntimeError):
    """The error $LAB_FAIL_AT makes a stage raise at a named moment: a bug anywhere in it, for the stress tests."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the stage is; a KeyboardInterrupt so every Ctrl-C cleanup path runs too
    (temp outputs discarded, the MLflow run ended KILLED)."""


def _stop(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Before the commit point: record the signal and raise. SIGTERM is never set to ignored here, so a second
    one, during the cleanup the first started, is recorded too (and stops a `shielded` cleanup if it comes twice)."""
    if _shield_depth:
        _shielded.append(signum)
        if len(_shielded) > 1:
            raise _stop(signum)
        return
    _received.append(signum)
    raise _stop(signum)


def install_handlers(stage: str) -> None:
    """SIGTERM and SIGINT record the signal and raise `Terminated` or KeyboardInterrupt; SIGINT stays ignored if it
    was. Reads where `stage` is to pause, if anywhere: the first moment, `start-up`, is right here, before the
    stage's imports."""
    global _pause_at, _fail_at, _stage_name
    _stage_name = stage
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    _pause_at = _requested_pause(stage)
    failing = os.environ.get(FAIL_VARIABLE, "")
    _fail_at = failing if failing.startswith(f"{stage}:") else ""
    pause_at("start-up")


def received_signal() -> int | None:
    """The first SIGINT/SIGTERM received before the commit point, if any."""
    return _received[0] if _received else None


def raise_swallowed() -> None:
    """Raise KeyboardInterrupt/Terminated if a signal arrived before the commit point: its own exception, raised in a
    finalizer or callback, may have been dropped. Runs the handlers of signals pending right now first."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # CPython runs pending handlers in it (PyErr_CheckSignals)
    if _received and not _committing:
        raise _stop(_received[0])


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """The cleanup a stop starts (ending the MLflow run KILLED): one signal meanwhile is recorded, not raised, so
    the cleanup finishes; a second one stops it at once, as a user who insists expects."""
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
        if not _shield_depth:
            _received.extend(_shielded)
            _shielded.clear()


def _requested_pause(stage: str) -> str:
    wanted = os.environ.get(PAUSE_VARIABLE, "")
    plan = os.environ.get(PLAN_VARIABLE, "")
    if not wanted and plan and os.environ.get("DVC_EXP_NAME"):
        with contextlib.suppress(OSError, ValueError):
            wanted = str(json.loads(Path(plan).read_text()).get(os.environ["DVC_EXP_NAME"], ""))
    return wanted if wanted.startswith(f"{stage}:") else ""


def _defer(signum: int, frame: FrameType | None) -> None:
    _deferred.append(signum)
    if len(_deferred) > 1:  # the second one: stop now, whatever is left undone
        raise _stop(signum)


def enter_commit_point() -> None:
    """Call right before the first output is renamed into place. A signal that already arrived raises here;
    any later one is deferred until the stage is done (`deferred_signal`)."""
    global _committing
    if _committing:
        return
    # A signal that has arrived, handled or pending, and whose exception never got here, stops the stage here,
    # before any rename.
    raise_swallowed()
    for signum in _INTERRUPTS:
        if signal.getsignal(signum) not in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.signal(signum, _defer)
    _committing = True


def past_commit_point() -> bool:
    """Whether this stage has begun to move its outputs into place."""
    return _committing


def deferred_signal() -> int | None:
    """The first SIGINT/SIGTERM received after the commit point, if any."""
    return _deferred[0] if _deferred else None


def exit_at_further_signal(code: int | None, codes: dict[int, int]) -> None:
    """From here on a SIGINT/SIGTERM ends the process at once (`os._exit`), with `code`, or where the stage
    finished (None) with the signal's own (`codes`): the stage's work and its messages are done, and only the
    interpreter's shutdown is left, where a raised exception would land in an atexit callback or a finalizer,
    be printed with its traceback and dropped, and a finished stage would exit 0 despite the stop."""

    def exit_now(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(codes[signum] if code is None else code)

    for signum in _INTERRUPTS:
        if signal.getsignal(signum) not in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.signal(signum, exit_now)


def seconds_since_process_start() -> float:
    """Wall seconds since this process started, from the kernel's record (/proc/self/stat's start time, in clock
    ticks since boot; 10 ms resolution); nan where there is no /proc."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return math.nan
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def note_moment(moment: str) -> None:
    """Append `moment` to $LAB_TIMELINE's file, with this process's age, where it is set."""
    timeline = os.environ.get(TIMELINE_VARIABLE)
    if timeline:
        with open(timeline, "a") as stream:
            stream.write(f"{_stage_name or '-'} {moment} {seconds_since_process_start():.3f}\n")


def pause_at(moment: str) -> None:
    """Hold here while $LAB_PAUSE_AT names `moment` (tests only): say so on stderr, then sleep until a signal
    ends it (KeyboardInterrupt/Terminated raised here) or PAUSE_LIMIT_S passes. Where $LAB_FAIL_AT names it, raise
    InjectedFailure instead. Where $LAB_TIMELINE names a file, note the moment there first."""
    note_moment(moment)
    if _fail_at and _fail_at.partition(":")[2] == moment:
        raise InjectedFailure(f"failure injected at {_fail_at} (${FAIL_VARIABLE})")
    if not _pause_at or _pause_at.partition(":")[2] != moment:
        return
    print(f"[paused at {_pause_at}]", file=sys.stderr, flush=True)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
