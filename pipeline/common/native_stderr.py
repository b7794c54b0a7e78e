"""Keep known, harmless messages of native libraries out of a stage's console.

Kineto (torch.profiler's C++ back end) writes to the process's file descriptor 2 directly, past
Python's `sys.stderr`, so neither `warnings` filters nor logging settings reach it; its own
`KINETO_LOG_LEVEL` does not silence these lines either (checked with torch 2.14). On a machine
without an NVIDIA driver a CUDA build of torch prints, on every profiler run, even a CPU-only one:

    ERROR:... DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35

(35 = cudaErrorInsufficientDriver: no GPU driver; the trace only lacks GPU properties it would not
have anyway), plus `USDT:`/`STAGE:` progress lines. `filtered_native_stderr` sends descriptor 2 to
a temporary file while the block runs and writes back every line except those, so real errors
still reach the user, in order, after the block.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# Kineto's progress markers, the no-driver message on a machine without a GPU driver, and the memory profiler's
# note that a block allocated before tracing began (the last step's gradients) was freed while tracing: expected in
# the first training step traced with `profile_memory` in a process, printed once per process by c10 straight to
# descriptor 2. The memory measurement profiles a step before the one it measures for that reason
# (pipeline.profiling.memory), so the missing free event does not change what it reports.
KINETO_NOISE = re.compile(
    rb"^(USDT|STAGE):\S* \S+ \d+:\d+ \S+\] "
    rb"|^ERROR:\S* \S+ \d+:\d+ DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed with code 35"
    rb"|^\[W\d+ [\d:.]+ CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before the profiling"
)


@contextlib.contextmanager
def filtered_native_stderr(noise: re.Pattern[bytes] = KINETO_NOISE) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not noise.match(line)]
            if kept:
                sys.stderr.write(b"".join(kept).decode(errors="replace"))
                sys.stderr.flush()
