"""Time a device's combinations in K fresh worker processes, in waves (pipeline.profiling.worker).

The process is the unit of repetition (as pyperf's worker processes, and Kalibera & Jones's top level):
each worker is a new process, forked from a clean server that paid the imports once, that times every
combination interleaved for its share of the budget. A combination's estimate is the median of the workers'
medians, its interval their spread; a ratio between two combinations is taken round by round inside each worker
and its interval comes from the spread of the workers' ratios (pipeline.records.statistics). Workers run in waves
of `processes_at_once`, each on cores of its own and beside workers doing the same, never beside the stage's own
work: on a CPU two at once where the machine has two cores each (docs/timing.md says what that moves), else one.

A worker that fails stops the stage with its own last lines. The server runs in a session of its own, and
any way the stage stops (Ctrl-C, SIGTERM, an error) kills that session, workers included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import torch

from pipeline.common.errors import PipelineError
from pipeline.profiling.timing import StepTiming
from pipeline.profiling.worker import READY, WorkerSpec, serve
from pipeline.records.quantities import MeasurementConditions, MemoryPart, StepEnergy, StepMemory
from pipeline.records.statistics import (
    Block,
    between_process_interval,
    comparison_pairs,
    estimate_over_processes,
    own_spread_pct,
    process_speeds,
    process_values,
)

# The NVIDIA driver's device files. NVML opens them in the profile stage before it forks its timing server (the
# stage's device check, made fork-safe by pipeline.profiling.timing) and keeps its state in memory the server
# inherits: the server keeps them open, or in every timing process `torch.cuda.is_available()` turns False and the
# first `torch.cuda.synchronize` fails ("invalid argument to exchangeDevice", seen on an H200).
DRIVER_DEVICES = "/dev/nvidia"

# A server forks every timing process, so it must hold no thread but its own: fork copies only the calling thread,
# and a pool whose workers vanish can deadlock the child (Python 3.12 warns on every such fork). The only pool
# importing torch starts is numpy's OpenBLAS (one worker per core, at import); nothing timed uses numpy's BLAS. The
# other is NVML's, once anything asks for a GPU: the server never asks (pipeline.profiling.timing's `_timer_class`).
SERVER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1"}


@dataclass(frozen=True)
class WorkerResult:
    blocks: tuple[tuple[Block, ...], ...]  # per item of the spec, one block per round
    seconds: float  # the worker's timing only
    conditions: MeasurementConditions
    memory: tuple[StepMemory, ...]  # per item of the spec but GRADIENTS ones; empty where the spec measures none
    energy: tuple[dict[str, Any], ...]  # per item where the spec names a counter: its figures, or why none
    page_faults: tuple[float, ...] = ()  # per item where the spec counts them: minor page faults per step
    window: tuple[float, float] = (0.0, 0.0)  # wall-clock seconds (epoch) from its start of work to its answer


def _parse(answer: str, spec: WorkerSpec) -> WorkerResult:
    raw = json.loads(answer)
    if "user_error" in raw:
        raise PipelineError(f"a timing process of {spec.items_phrase()}: {raw['user_error']}")
    if "error" in raw:
        raise PipelineError(
            f"a timing process of {spec.items_phrase()} failed; its last lines:\n{str(raw['error']).strip()[-2000:]}"
        )
    timing = raw["timing"]
    return WorkerResult(
        blocks=tuple(tuple(Block(int(steps), float(seconds)) for steps, seconds in item) for item in timing["items"]),
        seconds=float(timing["seconds"]),
        conditions=MeasurementConditions(**timing["conditions"]),
        memory=tuple(
            StepMemory(**{**found, "parts": tuple(MemoryPart(**part) for part in found["parts"])})
            for found in timing["memory"]
        ),
        energy=tuple(timing.get("energy", [])),
        page_faults=tuple(float(count) for count in timing.get("page_faults", [])),
        window=(float(timing["window"][0]), float(timing["window"][1])),
    )


class WorkerServer(Protocol):
    """A running timing server: specs to its stdin, one JSON answer per spec from its stdout."""

    @property
    def pid(self) -> int: ...
    @property
    def stdin(self) -> IO[str] | None: ...
    @property
    def stdout(self) -> IO[str] | None: ...
    def poll(self) -> int | None: ...


@contextlib.contextmanager
def worker_server(training: bool = True, ready: bool = False) -> Iterator[WorkerServer]:
    """`python -m pipeline.profiling.worker` in a session of its own, killed with its workers on the way out.
    `training=False`: it will time inference steps only, and skips importing what only training reaches.
    `ready`: return once it has imported everything. A caller that times must have every server ready before its
    first spec, so that no timing shares the cores with a server's imports: `ready=True`, or start several and
    `wait_until_ready` for each (their imports overlap one another, but no timing).
    For a caller that has run tensor code already (a benchmark, a test); the profile stage forks its server
    (`forked_worker_server`) and saves the server's imports."""
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.profiling.worker", *([] if training else ["--inference-only"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **SERVER_ENVIRONMENT},
    )
    try:
        if ready:
            wait_until_ready(server)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        for stream in (server.stdin, server.stdout):
            if stream is not None:
                stream.close()


def wait_until_ready(server: WorkerServer) -> None:
    """Until a started `worker_server` has done its imports (its READY line)."""
    assert server.stdout is not None
    if server.stdout.readline().strip() != READY:
        raise PipelineError(
            f"a timing server ended (exit code {server.poll()}) before it was ready; its messages are above. "
            "Rerun the stage."
        )


@dataclass
class _ForkedServer:
    pid: int
    stdin: IO[str]
    stdout: IO[str]
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


@contextlib.contextmanager
def forked_worker_server(training: bool = True) -> Iterator[WorkerServer]:
    """The timing server forked from this process: the same server as `worker_server`'s, in a session of its
    own and killed with its workers on the way out, without paying torch's imports (seconds of CPU) a second time
    per profile stage.

    Only for a process that has imported torch and run no tensor code yet, so that the server and every timing
    process forked from it start from the clean state a fresh `python -m pipeline.profiling.worker` has: no
    thread pool, no allocation, glibc malloc's defaults. The profile stage calls it first thing. `training`:
    torch._dynamo is imported here before the fork (this process needs it too: FLOP counting, the trace)."""
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError("forked_worker_server: CUDA is initialised here, and a forked child could not use it")
    if training:
        import torch._dynamo as _dynamo  # noqa: F401
    spec_read, spec_write = os.pipe()
    answer_read, answer_write = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing buffered here is written twice
    pid = os.fork()
    if pid == 0:
        _serve_forked(spec_read, answer_write)
    os.close(spec_read)
    os.close(answer_write)
    server = _ForkedServer(pid, os.fdopen(spec_write, "w"), os.fdopen(answer_read))
    try:
        yield server
    finally:
        for kill in (os.killpg, os.kill):  # the session, or the server alone if it has not made one yet
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
        if server.returncode is None:
            os.waitpid(pid, 0)
        server.stdin.close()
        server.stdout.close()


def _serve_forked(spec_read: int, answer_write: int) -> None:
    """In the forked server: a session of its own, the pipes as stdin and stdout, no other descriptor of the
    stage's (as `subprocess`'s close_fds) but the NVIDIA driver's, the exits of `python -m
    pipeline.profiling.worker`; never returns."""
    code = 1
    try:
        os.setsid()
        os.dup2(spec_read, 0)
        os.dup2(answer_write, 1)
        _close_all_but(_descriptors_open_on(DRIVER_DEVICES))
        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
        with open(0, closefd=False) as specs, open(1, "w", closefd=False) as answers:
            serve(training=False, specs=specs, answers=answers)  # what training needs is imported already
        code = 0
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)  # none of the stage's atexit handlers or buffers


def _descriptors_open_on(prefix: str) -> set[int]:
    """This process's descriptors open on a path that starts with `prefix`."""
    found = set()
    with contextlib.suppress(OSError):  # no /proc (not Linux): no NVML state to keep either
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}").startswith(prefix):
                    found.add(int(name))
    return found


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor from 3 up except those in `keep`."""
    low = 3
    for descriptor in sorted(d for d in keep if d >= low):
        os.closerange(low, descriptor)
        low = descriptor + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def ask(server: WorkerServer, spec: WorkerSpec) -> WorkerResult:
    send(server, spec)
    return receive(server, spec)


def send(server: WorkerServer, spec: WorkerSpec) -> None:
    """Hand `spec` to `server`, which forks a timing process for it; `receive` waits for its answer."""
    assert server.stdin is not None
    server.stdin.write(spec.to_json() + "\n")
    server.stdin.flush()


def receive(server: WorkerServer, spec: WorkerSpec) -> WorkerResult:
    """The answer of the timing process `send` started on `server`."""
    assert server.stdout is not None
    answer = server.stdout.readline()
    if answer.strip() == READY:  # a server nobody waited for (`worker_server(ready=False)`): its answer is next
        answer = server.stdout.readline()
    if not answer:
        raise PipelineError(
            f"the timing server ended (exit code {server.poll()}) before timing {spec.items_phrase()}; its messages "
            "are above. Rerun the stage."
        )
    return _parse(answer, spec)


@dataclass(frozen=True)
class PairedTiming:
    """Every item of a spec timed in the same processes: each item's StepTiming, and each process's blocks in round
    order (what paired ratios are taken from)."""

    timings: tuple[StepTiming, ...]  # per item of the spec
    process_blocks: tuple[tuple[tuple[Block, ...], ...], ...]  # [process][item]: that process's blocks of the item
    speeds: tuple[float, ...]  # per process: the speed factor all its items shared (statistics.process_speeds)
    # Per item but GRADIENTS ones: the median process's, with the range over processes; empty: not measured.
    memory: tuple[StepMemory, ...]
    energy: tuple[StepEnergy | str | None, ...]  # per item: over the processes; why none (str); None: not measured
    page_faults: tuple[tuple[float, ...], ...] = ()  # per item: each process's page faults per step; empty: not counted
    windows: tuple[tuple[float, float], ...] = ()  # per process: when it worked (WorkerResult.window)
    # The alternate spec's timing (glibc malloc's defaults): its process i ran next to process i of this one.
    alternate: PairedTiming | None = None


def time_in_processes(
    spec: WorkerSpec,
    processes: int,
    progress: Callable[[int], object] | None = None,
    server: WorkerServer | None = None,
    servers: int = 1,
    alternate: WorkerSpec | None = None,
    starting: Sequence[WorkerServer] = (),
    at_once: int = 1,
) -> PairedTiming:
    """Time every item of `spec` in `processes` workers, each with `spec.budget_s` / `processes` of timing and its
    own round order, forked in turn from `servers` servers: `server` (a `forked_worker_server` or `worker_server`
    the caller started), those in `starting` (`worker_server(ready=False)`s the caller started early, so that their
    imports overlap its own work; waited for here) and new `worker_server`s for the rest. Each new server is a new
    program start, with its own address-space layout and hash seed, which every worker forked from it shares.

    `at_once`: workers of the same spec run this many at a time, each forked from another server (at most
    `servers`), so that each shares the machine only with a worker doing the same (`processes_at_once` says how
    many a machine's cores hold). A worker's stopping rule reads the workers that finished before its wave began.

    `alternate`: the same items set up another way (glibc's defaults), timed in as many workers, each wave of them
    right beside the wave of `spec` with the same indices (first and second in turn, so that neither set-up always
    runs first), so that a ratio between the two set-ups can be taken pair by pair. `progress(i)` is called after
    worker i (1-based) of `spec`, and its partner, finished."""
    results: list[WorkerResult] = []
    partners: list[WorkerResult] = []
    training = any(mode != "inference" for _, mode in spec.items)
    with contextlib.ExitStack() as stack:
        started = [server] if server is not None else []
        new = [*starting][: max(servers - len(started), 0)]
        new += [
            stack.enter_context(worker_server(training, ready=False)) for _ in range(servers - len(started) - len(new))
        ]
        for each in new:  # their imports overlap one another, and no timing
            wait_until_ready(each)
        started += new
        width = max(1, min(at_once, len(started)))
        for first in range(0, processes, width):
            wave = range(first, min(first + width, processes))
            pair = ((results, spec), (partners, alternate))
            for found, kind in pair if first // width % 2 == 0 else pair[::-1]:
                if kind is None:
                    continue
                earlier = tuple(contributed(result, kind) for result in found)
                asked = []
                for index in wave:
                    share = dataclasses.replace(
                        kind, budget_s=kind.budget_s / processes, seed=kind.seed + index, earlier=earlier
                    )
                    each = started[index % len(started)]  # a worker and its partner: one program start
                    send(each, share)
                    asked.append((each, share))
                found.extend(receive(each, share) for each, share in asked)
            if progress is not None:
                for index in wave:
                    progress(index + 1)
    paired = combine(results, spec)
    return dataclasses.replace(paired, alternate=combine(partners, alternate)) if alternate is not None else paired


MOST_AT_ONCE = 2  # auto's most timing processes side by side: measured so on a 2-core VM (docs/timing.md)


def physical_cores() -> int:
    """Cores this process may run on, counting SMT siblings (hyperthreads of one core) once: two timing processes
    on siblings would share one core's execution units, which two on cores of their own do not."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    groups = set()
    for cpu in allowed:
        try:
            groups.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:  # no sysfs topology: count it as a core of its own
            groups.add(str(cpu))
    return len(groups)


def processes_at_once(requested: int, on_host: bool, threads: int, reads_energy: bool, servers: int) -> int:
    """How many timing processes run side by side: `requested`, or for 0 (auto) as many as the cores hold with
    `threads` each, at most MOST_AT_ONCE, on a CPU only (a GPU's processes would share the one device), and one
    while an energy counter is read (it counts the whole package or device: a neighbour's work too). Never more
    than `servers`: each process of a wave is forked from another program start."""
    if requested == 0:
        requested = min(MOST_AT_ONCE, physical_cores() // max(threads, 1)) if on_host and not reads_energy else 1
    return max(1, min(requested, servers))


def contributed(result: WorkerResult, spec: WorkerSpec) -> tuple[float, ...]:
    """What one timing process contributed to the estimates (`process_values`): the next ones' stop is set from it."""
    rounds = [[block.step_ms for block in item] for item in result.blocks]
    return process_values(rounds, comparison_pairs(spec.items))


def combine(results: Sequence[WorkerResult], spec: WorkerSpec) -> PairedTiming:
    """The workers' timings as one per item: the estimate over processes, all blocks in order, the conditions from
    the first worker's start to the last one's end, and the timing seconds summed (what the budget counts)."""
    first, last = results[0].conditions, results[-1].conditions
    conditions = dataclasses.replace(first, load_average_after=last.load_average_after)
    medians = [[statistics.median(block.step_ms for block in item) for item in result.blocks] for result in results]
    speeds = process_speeds(medians)
    timings = []
    for index, (batch_size, _) in enumerate(spec.items):
        per_process = [result.blocks[index] for result in results]
        process_ms = [process[index] for process in medians]
        timings.append(
            StepTiming(
                estimate=estimate_over_processes(per_process, batch_size, spec.ci_target_pct),
                blocks=tuple(block for blocks in per_process for block in blocks),
                conditions=conditions,
                steps_per_block=max(block.steps for blocks in per_process for block in blocks),
                seconds=sum(result.seconds for result in results) / len(spec.items),
                process_medians_ms=tuple(process_ms),
                own_ci_pct=own_spread_pct(process_ms, speeds) if len(spec.items) > 1 and len(results) > 1 else None,
            )
        )
    items = range(len(spec.items))
    measured = range(len(results[0].memory))  # every item but GRADIENTS ones, which come last (timing_spec)
    memory = tuple(over_processes([result.memory[index] for result in results]) for index in measured)
    energy = tuple(
        energy_over_processes([result.energy[index] for result in results]) if spec.energy else None for index in items
    )
    faults = tuple(tuple(result.page_faults[index] for result in results) for index in items if spec.page_faults)
    windows = tuple(result.window for result in results)
    return PairedTiming(
        tuple(timings), tuple(result.blocks for result in results), speeds, memory, energy, faults, windows=windows
    )


def energy_over_processes(found: Sequence[dict[str, Any]]) -> StepEnergy | str:
    """One item's energy per step over the processes: their median, the interval from their spread (as for the
    step time); or why there is none, as the first process that had none said."""
    missing = next((answer["unavailable"] for answer in found if "unavailable" in answer), None)
    if missing is not None:
        return str(missing)
    values = [float(answer["joules_per_step"]) for answer in found]
    median = statistics.median(values)
    low, high = between_process_interval(values) or (min(values), max(values))
    return StepEnergy(
        joules_per_step=median,
        joules_per_step_low=low,
        joules_per_step_high=high,
        mean_power_w=statistics.median(float(answer["mean_power_w"]) for answer in found),
        counter=str(found[0]["counter"]),
        update_period_ms=1000 * statistics.median(float(answer["update_period_s"]) for answer in found),
        windows=sum(int(answer["windows"]) for answer in found),
        processes=len(found),
    )


def over_processes(found: Sequence[StepMemory]) -> StepMemory:
    """One item's memory as the processes measured it: the median process's breakdown (by peak), with the least
    and the most any process measured."""
    ordered = sorted(found, key=lambda memory: memory.peak_bytes)
    return dataclasses.replace(
        ordered[(len(ordered) - 1) // 2],
        peak_low_bytes=ordered[0].peak_bytes,
        peak_high_bytes=ordered[-1].peak_bytes,
        processes=len(ordered),
    )
