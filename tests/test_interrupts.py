"""The commit point (pipeline.common.interrupts), in fresh interpreters: a signal before it stops the stage with
nothing written; one after it is recorded, the stage finishes, then stops the pipeline; a second one stops it at
once; an ignored SIGINT stays ignored. tests/test_signal_stress.py stops the real train stage at its named moments."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.projects import default_sigint
from tests.helpers.repo import REPO_ROOT


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with SIGINT at its default, as in a terminal, however pytest was started."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=default_sigint,
    )


def _stage_writing(output: Path, signal_name: str, inside: bool) -> subprocess.CompletedProcess[str]:
    """A stage (run_stage) that writes `output` through AtomicOutputs and sends itself `signal_name` while the file
    is staged (`inside`) or after it was renamed into place; it prints "finished" if it gets to its end."""
    send = f"os.kill(os.getpid(), signal.{signal_name})"
    return _run(
        f"""
        import os, signal
        from pathlib import Path
        from pipeline.common.outputs import AtomicOutputs
        from pipeline.common.stage_runner import run_stage

        def main():
            with AtomicOutputs() as outputs:
                outputs.write_text(Path({str(output)!r}), "complete")
                {send if inside else "pass"}
            {"pass" if inside else send}
            print("finished")

        run_stage("train", main)
        """
    )


def test_a_stage_signalled_after_its_commit_keeps_its_outputs_and_still_stops_the_pipeline(tmp_path: Path) -> None:
    result = _stage_writing(tmp_path / "out.txt", "SIGINT", inside=False)  # what a late Ctrl-C meets
    assert result.returncode == 130, result.stdout + result.stderr
    assert result.stdout.strip() == "finished"
    assert "stage 'train' received SIGINT after its outputs were committed" in result.stderr
    assert (tmp_path / "out.txt").read_text() == "complete" and list(tmp_path.glob(".partial-*")) == []


def test_a_signal_before_the_commit_leaves_no_output(tmp_path: Path) -> None:
    result = _stage_writing(tmp_path / "out.txt", "SIGTERM", inside=True)  # staged, not yet renamed
    assert result.returncode == 143 and "finished" not in result.stdout, result.stdout + result.stderr
    assert "stage 'train' terminated (SIGTERM); no outputs were written." in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_after_the_commit_point_a_signal_is_recorded_and_a_second_one_stops_at_once() -> None:
    result = _run(
        """
        import os, signal
        from pipeline.common.interrupts import deferred_signal, enter_commit_point, install_handlers
        install_handlers("train")
        enter_commit_point()
        os.kill(os.getpid(), signal.SIGINT)
        print("renamed and finished despite", signal.Signals(deferred_signal()).name)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            print("second signal ignored")
        except KeyboardInterrupt as error:
            print("second signal:", type(error).__name__)
        """
    )
    assert result.stdout.splitlines() == ["renamed and finished despite SIGINT", "second signal: Terminated"], (
        result.stdout + result.stderr
    )


def test_an_ignored_sigint_stays_ignored_after_the_commit_point() -> None:
    result = _run(
        """
        import os, signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job of a non-interactive shell
        from pipeline.common.interrupts import deferred_signal, enter_commit_point, install_handlers
        install_handlers("train")
        enter_commit_point()
        os.kill(os.getpid(), signal.SIGINT)
        print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, deferred_signal())
        """
    )
    assert result.stdout.strip() == "True None", result.stdout + result.stderr


def test_the_stress_summary_gives_each_path_its_stops_median_and_range() -> None:
    from types import SimpleNamespace

    from tests.helpers.stress import EXIT_PROPERTY, exit_summary

    def report(nodeid: str, *seconds: float) -> SimpleNamespace:
        return SimpleNamespace(nodeid=nodeid, user_properties=[(EXIT_PROPERTY, value) for value in seconds])

    lines = exit_summary(
        [
            report("tests/test_signal_stress.py::test_the_stage_alone_stops[start-up]", 1.0, 3.0),
            report("tests/test_signal_stress.py::test_the_stage_alone_stops[commit]", 2.5, 0.5),
            report("tests/test_signal_stress_queue.py::test_queue_kill", 4.0),
            report("tests/test_other.py::test_without_stops"),
        ]
    )
    assert lines == [
        "test_queue_kill: 1 stops, gone 4.00 s after the signal (median; 4.00-4.00 s, limit 10 s)",
        "test_the_stage_alone_stops: 4 stops, gone 1.75 s after the signal (median; 0.50-3.00 s, limit 10 s)",
    ]
    assert exit_summary([report("tests/test_x.py::test_y")]) == []


def test_ci_stops_at_one_moment_per_commit_and_consecutive_commits_cover_all_ten() -> None:
    """`make test-stress-sample` (.ci/run): $LAB_STRESS_MOMENTS narrows the stress tests to the moments it names,
    and the moment CI picks from the commit count walks through all ten, one commit at a time."""
    import pytest

    from tests.helpers.stress import ALL_MOMENTS, chosen_moments, moment_for

    assert len(ALL_MOMENTS) == 10 and chosen_moments("") == chosen_moments("  ") == ALL_MOMENTS
    assert chosen_moments("training, commit") == ("training", "commit")
    with pytest.raises(pytest.UsageError, match=r"names no moment \['trainig'\]; the moments: start-up, imported"):
        chosen_moments("training,trainig")
    assert [moment_for(count) for count in range(120, 130)] == list(ALL_MOMENTS)
    assert sorted(moment_for(count) for count in range(57, 67)) == sorted(ALL_MOMENTS)  # any ten in a row
    assert moment_for(130) == moment_for(120) == ALL_MOMENTS[0]


def test_ci_samples_one_stage_per_commit_and_thirty_consecutive_commits_cover_every_stage_at_every_moment() -> None:
    from tests.helpers.stress import ALL_MOMENTS, STAGE_NAMES, chosen_stages, moment_for, stage_for

    assert chosen_stages("") == STAGE_NAMES and chosen_stages("profile, report") == ("profile", "report")
    with pytest.raises(pytest.UsageError, match=r"names no stage \['reprot'\]"):
        chosen_stages("reprot")
    for first in (0, 41):
        pairs = {(stage_for(count), moment_for(count)) for count in range(first, first + 30)}
        assert pairs == {(stage, moment) for stage in STAGE_NAMES for moment in ALL_MOMENTS}


def test_a_failure_injected_at_a_moment_is_raised_there_and_nowhere_else(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.common import interrupts

    monkeypatch.setattr(interrupts, "_fail_at", "report:report-built")
    interrupts.pause_at("params-loaded")  # another moment: goes on
    with pytest.raises(interrupts.InjectedFailure, match=r"failure injected at report:report-built \(\$LAB_FAIL_AT\)"):
        interrupts.pause_at("report-built")


def _stage_with_dropped_signals(output: Path, *signal_names: str) -> subprocess.CompletedProcess[str]:
    """A stage that, before its commit point, receives each of `signal_names` while Python runs a finalizer (a
    WeakKeyDictionary's weakref callback and a `__del__`), where an exception raised by the handler is printed
    ("Exception ignored in") and dropped; then it writes `output` through AtomicOutputs and prints "finished"."""
    output.write_text("old")
    return _run(
        f"""
        import gc, os, signal, time, weakref
        from pathlib import Path
        from pipeline.common.outputs import AtomicOutputs
        from pipeline.common.stage_runner import run_stage

        class Key:
            def __del__(self):
                os.kill(os.getpid(), signal.{signal_names[-1]})
                time.sleep(0.05)  # the handler runs in here

        def main():
            table = weakref.WeakKeyDictionary()
            key = Key()
            weakref.finalize(key, lambda: (os.kill(os.getpid(), signal.{signal_names[0]}), time.sleep(0.05)))
            table[key] = "value"
            del key
            gc.collect()
            with AtomicOutputs() as outputs:
                outputs.write_text(Path({str(output)!r}), "new")
            print("finished")

        run_stage("report", main)
        """
    )


def test_a_signal_whose_exception_a_finalizer_drops_still_stops_the_stage_before_its_commit(tmp_path: Path) -> None:
    result = _stage_with_dropped_signals(tmp_path / "out.txt", "SIGTERM", "SIGTERM")
    assert "Exception ignored in" in result.stderr  # the exception was dropped where it was raised
    assert result.returncode == 143 and "finished" not in result.stdout, result.stdout + result.stderr
    assert "stage 'report' terminated (SIGTERM); no outputs were written." in result.stderr
    assert (tmp_path / "out.txt").read_text() == "old" and list(tmp_path.glob(".partial-*")) == []


def test_a_dropped_sigint_stops_the_stage_with_exit_130(tmp_path: Path) -> None:
    result = _stage_with_dropped_signals(tmp_path / "out.txt", "SIGINT", "SIGINT")
    assert result.returncode == 130 and "finished" not in result.stdout, result.stdout + result.stderr
    assert "stage 'report' interrupted; no outputs were written." in result.stderr
    assert (tmp_path / "out.txt").read_text() == "old"


def _stage_with_a_run(folder: Path, body: str, clean_up: str = "") -> subprocess.CompletedProcess[str]:
    """A stage with a real MLflow run in `folder`'s store: `body` runs inside open_tracker; `clean_up` runs at the
    start of the run's cleanup. Prints the run's status last."""
    return _run(
        f"""
        import gc, os, signal, time, weakref
        from pathlib import Path
        from mlflow import MlflowClient
        import pipeline.tracking.lifecycle as lifecycle
        from pipeline.common.stage_runner import run_stage
        from pipeline.params.schema import TrackingConfig
        from tests.helpers.stores import empty_store

        os.environ.pop("MLFLOW_TRACKING_URI", None)  # the store below, whatever the suite's process had set
        folder = Path({str(folder)!r})
        uri = empty_store(folder)
        original = lifecycle._clean_up

        def clean_up(*arguments):
            {clean_up or "pass"}
            original(*arguments)

        lifecycle._clean_up = clean_up

        def main():
            with lifecycle.open_tracker("probe", TrackingConfig("probe", "runs", "lab-model"), root=folder):
                {body}

        try:
            run_stage("probe", main)
        finally:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
            client = MlflowClient(uri)
            runs = client.search_runs([client.get_experiment_by_name("probe").experiment_id],
                                      filter_string="tags.`mlflow.runName` = 'probe'")
            print("status", [run.info.status for run in runs])
        """
    )


@pytest.mark.slow  # a process that imports MLflow and opens a store: `make test` only
def test_a_run_whose_stop_a_finalizer_dropped_ends_killed_not_finished(tmp_path: Path) -> None:
    body = "weakref.finalize(type('K', (), {})(), lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.05)))"
    result = _stage_with_a_run(tmp_path, f"{body}; gc.collect()")
    assert "Exception ignored in" in result.stderr
    assert result.returncode == 143, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "status ['KILLED']", result.stdout + result.stderr


@pytest.mark.slow  # a process that imports MLflow and opens a store: `make test` only
def test_a_second_sigterm_during_the_cleanup_is_not_lost_and_the_run_still_ends_killed(tmp_path: Path) -> None:
    result = _stage_with_a_run(
        tmp_path,
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(1)",
        clean_up="os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.05); print('received', signal.getsignal(15))",
    )
    assert result.returncode == 143, result.stdout + result.stderr
    assert "received <function _on_signal" in result.stdout, result.stdout  # not SIG_IGN: a later one is heard
    assert result.stdout.splitlines()[-1] == "status ['KILLED']", result.stdout + result.stderr


def test_in_a_shielded_cleanup_one_more_signal_is_recorded_and_a_second_stops_it() -> None:
    result = _run(
        """
        import os, signal
        from pipeline.common.interrupts import install_handlers, received_signal, shielded
        install_handlers("train")
        try:
            with shielded():
                os.kill(os.getpid(), signal.SIGTERM)
                print("cleanup goes on")
                os.kill(os.getpid(), signal.SIGINT)
                print("second signal ignored")
        except KeyboardInterrupt as error:
            print("second signal:", type(error).__name__)
        print("recorded", signal.Signals(received_signal()).name)
        """
    )
    assert result.stdout.splitlines() == ["cleanup goes on", "second signal: KeyboardInterrupt", "recorded SIGTERM"], (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("stopped_before", [False, True])
def test_a_signal_during_the_interpreters_shutdown_is_never_swallowed(signal_name: str, stopped_before: bool) -> None:
    """A signal that arrives once the stage is over, while Python runs its atexit callbacks (torch's library
    finalizers did, seen in the stress test), ends the process at once: non-zero, with no traceback. Before, the
    handler raised inside the callback, Python printed the exception and dropped it, and a finished stage exited 0."""
    result = _run(
        f"""
        import atexit, os, signal, time
        from pipeline.common.stage_runner import run_stage

        def at_exit():
            os.kill(os.getpid(), signal.{signal_name})
            time.sleep(0.2)
            print("callback went on", flush=True)

        atexit.register(at_exit)

        def main():
            {"os.kill(os.getpid(), signal.SIGINT)" if stopped_before else "pass"}
            print("finished", flush=True)

        run_stage("probe", main)
        """
    )
    expected = 130 if stopped_before else {"SIGINT": 130, "SIGTERM": 143}[signal_name]
    assert result.returncode == expected, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    assert "callback went on" not in result.stdout
    assert ("finished" in result.stdout) is not stopped_before


_LEAVING_STAGE = """
import atexit, sys, threading, time
from pathlib import Path
from pipeline.common.stage_runner import run_stage_process

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))

def late() -> None:
    time.sleep(0.3)
    (out / "thread").write_text("joined")

def main() -> None:
    threading.Thread(target=late).start()  # not a daemon: the interpreter's exit would wait for it
    sys.stdout.write("buffered, not flushed")

run_stage_process("probe", main)
"""


def test_a_stage_process_ends_as_the_interpreter_would_without_its_teardown(tmp_path: Path) -> None:
    """`run_stage_process` leaves with `os._exit` once the stage returns, but first does what the interpreter's exit
    does that anyone can see: it joins the other threads, runs the atexit callbacks and flushes stdout."""
    result = subprocess.run(
        [sys.executable, "-c", _LEAVING_STAGE, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "buffered, not flushed"
    assert (tmp_path / "thread").read_text() == "joined" and (tmp_path / "atexit").read_text() == "ran"
