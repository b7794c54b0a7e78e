"""The process's memory allocator, set up so that a fresh stage runs as fast as a warm one.

glibc malloc serves a request above its mmap threshold (128 KiB at start) with a fresh `mmap` and gives it
back with `munmap` on free; it raises the threshold only as such blocks are freed, and trims the top of the
heap whenever more than twice that lies free. A training or profile step allocates its activations anew
every step (conv2's output at batch 64 is ~9.4 MB), so in a fresh process each step faults its memory in
again, page by page: several times the minor page faults of a tuned process, and a slower stage
(docs/allocator.md has the measurements).

`tune_allocator` sets three `mallopt` values through ctypes, the same as the environment variables
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456` would, but from inside the
process, so that `dvc repro` and `python -m stages.X` get it alike: every block comes from the heap (no mmap of
its own, so nothing is unmapped on free), freed heap is kept for reuse, and the heap grows in large steps.
Why not only raise the mmap threshold (`MALLOC_MMAP_THRESHOLD_`): glibc caps it at 32 MiB,
and a test batch of 1000 images has 86-147 MB activations, which were still mapped and faulted in anew each
batch; `benchmarks.allocator` measures both, with transparent huge pages, jemalloc and tcmalloc
(docs/allocator.md). Results do not change (the
same arithmetic on the same values; `metrics/train.json` stays byte-identical), only where the bytes live.
Memory held: up to `TRIM_THRESHOLD` of freed heap stays mapped until the process ends (a stage is short-lived),
and a freed block inside the heap is reused rather than returned (peak RSS measured in docs/measurements.md).

The setting is left alone where the user made a choice: an allocator preloaded with LD_PRELOAD (jemalloc,
tcmalloc, mimalloc), glibc's own MALLOC_* variables or GLIBC_TUNABLES. `LAB_ALLOCATOR=default` keeps
glibc's defaults: the profile's what-if and the benchmarks use it to measure what the tuning is worth.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.common.errors import PipelineError

ALLOCATOR_VARIABLE = "LAB_ALLOCATOR"
TUNED = "tuned"
DEFAULT = "default"

_MIB = 1 << 20
MMAP_MAX = 0  # blocks glibc may map on their own: none, so no buffer is unmapped on free and faulted in again
TRIM_THRESHOLD = 1024 * _MIB  # keep up to this much freed heap instead of returning it to the OS every step
TOP_PAD = 256 * _MIB  # grow the heap in steps this large (address space only: untouched pages cost nothing)
# <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4

_ENVIRONMENT_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")


@dataclass(frozen=True)
class AllocatorSetup:
    """What this process allocates with: `kind` is one word (`tuned`, `default`, `environment`, `preloaded`,
    `unknown`); `description` says it to a reader (params, profile.json, the report's environment table)."""

    kind: str
    description: str


_current: AllocatorSetup | None = None


def tune_allocator(environ: Mapping[str, str] = os.environ) -> AllocatorSetup:
    """Set up this process's allocator as `plan_allocator` says (once; later calls return the first answer)."""
    global _current
    if _current is None:
        plan = plan_allocator(environ)
        _current = _apply(plan) if plan.kind == TUNED else plan
    return _current


def current_allocator(environ: Mapping[str, str] = os.environ) -> AllocatorSetup:
    """What this process allocates with now: the set-up `tune_allocator` made, else the untouched state."""
    return _current or glibc_defaults(environ) or plan_allocator(environ)


def glibc_defaults(environ: Mapping[str, str] = os.environ) -> AllocatorSetup | None:
    """glibc's defaults, where this process still runs them and `tune_allocator` would tune them; else None
    (already tuned, or a set-up the user chose: then there is no untuned state to measure)."""
    if _current is not None or plan_allocator(environ).kind != TUNED:
        return None
    libc = _glibc()
    return _defaults(f"glibc {libc[1] if libc else '?'}")


def plan_allocator(environ: Mapping[str, str] = os.environ) -> AllocatorSetup:
    """The set-up `tune_allocator` makes (kind `tuned`) or leaves (any other kind), decided from the environment."""
    requested = environ.get(ALLOCATOR_VARIABLE, TUNED).strip() or TUNED
    if requested not in (TUNED, DEFAULT):
        raise PipelineError(
            f"${ALLOCATOR_VARIABLE} is {requested[:40]!r}; it must be `{TUNED}` (the stages' setting) or "
            f"`{DEFAULT}` (glibc's own defaults, to measure what the tuning is worth). Unset it to use `{TUNED}`."
        )
    preloaded = [name for name in _PRELOADED if name in environ.get("LD_PRELOAD", "")]
    if preloaded:
        return AllocatorSetup("preloaded", f"{preloaded[0]} (LD_PRELOAD={environ['LD_PRELOAD']})")
    libc = _glibc()
    if libc is None:
        return AllocatorSetup("unknown", "the C library's malloc (not glibc: left as it is)")
    version = f"glibc {libc[1]}"
    chosen = [f"{name}={environ[name]}" for name in _ENVIRONMENT_SETTINGS if name in environ]
    if "malloc" in environ.get("GLIBC_TUNABLES", ""):
        chosen.append(f"GLIBC_TUNABLES={environ['GLIBC_TUNABLES']}")
    if chosen:
        return AllocatorSetup("environment", f"{version} malloc, set by the environment: {' '.join(chosen)}")
    if requested == DEFAULT:
        return _defaults(version)
    return AllocatorSetup(
        TUNED,
        f"{version} malloc, tuned: no mmap, trim threshold {TRIM_THRESHOLD // _MIB} MiB, top pad {TOP_PAD // _MIB} MiB",
    )


def _defaults(version: str) -> AllocatorSetup:
    return AllocatorSetup(DEFAULT, f"{version} malloc, defaults (dynamic mmap threshold from 128 KiB)")


def _apply(plan: AllocatorSetup) -> AllocatorSetup:
    libc = _glibc()
    assert libc is not None  # a `tuned` plan is made only for glibc
    mallopt = libc[0].mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = ((_M_MMAP_MAX, MMAP_MAX), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD))
    if not all(mallopt(option, value) == 1 for option, value in settings):
        return AllocatorSetup("unknown", f"glibc {libc[1]} malloc (mallopt refused the settings: defaults or partial)")
    return plan


def _glibc() -> tuple[ctypes.CDLL, str] | None:
    """This process's C library and its glibc version, or None where it is not glibc (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    return libc, version().decode()
