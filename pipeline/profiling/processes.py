"""Time one combination in K fresh worker processes, one after the other (pipeline.profiling.worker).

The process is the unit of repetition (as pyperf's worker processes, and Kalibera & Jones's top level):
each worker is a new process, forked from a clean server that paid the imports once, warmed up and timed
for its share of the budget; the estimate is the median of the workers' medians and its interval comes from
their spread (pipeline.profiling.statistics). They run one at a time, never beside each other or the stage's
own work, so no worker's steps share the cores.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pipeline.common.errors import PipelineError
from pipeline.profiling.statistics import Block, MeasurementConditions, estimate_over_processes
from pipeline.profiling.timing import StepTiming
from pipeline.profiling.worker import WorkerSpec


@dataclass(frozen=True)
class WorkerResult:
    blocks: tuple[Block, ...]
    steps_per_block: int
    seconds: float  # the worker's timing only
    conditions: MeasurementConditions


def _parse(answer: str, spec: WorkerSpec) -> WorkerResult:
    raw = json.loads(answer)
    if "user_error" in raw:
        raise PipelineError(
            f"a timing process of batch {spec.batch_size} ({spec.device}, {spec.mode}): {raw['user_error']}"
        )
    if "error" in raw:
        raise PipelineError(
            f"a timing process of batch {spec.batch_size} ({spec.device}, {spec.mode}) failed; its last lines:\n"
            f"{str(raw['error']).strip()[-2000:]}"
        )
    timing = raw["timing"]
    return WorkerResult(
        blocks=tuple(Block(int(steps), float(seconds)) for steps, seconds in timing["blocks"]),
        steps_per_block=int(timing["steps_per_block"]),
        seconds=float(timing["seconds"]),
        conditions=MeasurementConditions(**timing["conditions"]),
    )


@contextlib.contextmanager
def worker_server(training: bool = True) -> Iterator[subprocess.Popen[str]]:
    """`python -m pipeline.profiling.worker` in a session of its own, killed with its workers on the way out.
    `training=False`: it will time inference steps only, and skips importing what only training reaches."""
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.profiling.worker", *([] if training else ["--inference-only"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        for stream in (server.stdin, server.stdout):
            if stream is not None:
                stream.close()


def ask(server: subprocess.Popen[str], spec: WorkerSpec) -> WorkerResult:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(spec.to_json() + "\n")
    server.stdin.flush()
    answer = server.stdout.readline()
    if not answer:
        raise PipelineError(
            f"the timing server ended (exit code {server.poll()}) before timing batch {spec.batch_size} "
            f"({spec.device}, {spec.mode}); its messages are above. Rerun the stage."
        )
    return _parse(answer, spec)


def time_in_processes(
    spec: WorkerSpec,
    processes: int,
    progress: Callable[[int], None] | None = None,
    server: subprocess.Popen[str] | None = None,
) -> StepTiming:
    """Time `spec` in `processes` workers, each with `spec.budget_s` / `processes` of timing, forked from
    `server` (a `worker_server` the caller started for this combination) or else from a new one.

    `progress(i)` is called after worker i (1-based) finished."""
    share = dataclasses.replace(spec, budget_s=spec.budget_s / processes)
    results: list[WorkerResult] = []
    with contextlib.ExitStack() as stack:
        if server is None:
            server = stack.enter_context(worker_server(training=spec.mode != "inference"))
        for index in range(processes):
            results.append(ask(server, share))
            if progress is not None:
                progress(index + 1)
    return combine(results, spec)


def combine(results: Sequence[WorkerResult], spec: WorkerSpec) -> StepTiming:
    """The workers' timings as one: the estimate over processes, all blocks in order, the conditions from the
    first worker's start to the last one's end, and the timing seconds summed (what the budget counts)."""
    first, last = results[0].conditions, results[-1].conditions
    return StepTiming(
        estimate=estimate_over_processes([result.blocks for result in results], spec.batch_size, spec.ci_target_pct),
        blocks=tuple(block for result in results for block in result.blocks),
        conditions=dataclasses.replace(first, load_average_after=last.load_average_after),
        steps_per_block=max(result.steps_per_block for result in results),
        seconds=sum(result.seconds for result in results),
        process_medians_ms=tuple(statistics.median(block.step_ms for block in result.blocks) for result in results),
    )
