"""Which allocator set-up trains fastest in a fresh process: glibc's defaults, the stages' mallopt tuning, and
the alternatives a user can switch on without code (transparent huge pages, jemalloc, tcmalloc).

    python -m benchmarks.allocator [--samples 12800] [--test-samples 10000] [--repeats 3]

Each variant trains one epoch of the train stage's loop (`benchmarks.train_speed`'s `pipeline` worker) over the
first `--samples` training images, in a process of its own started for that run, as every DVC stage is; only
the environment differs. One repeat runs every variant once, in a rotated order; ratios are paired within a
repeat against glibc's defaults; the table gives the median and min-max over repeats, with the test accuracy
(the same on every row: an allocator moves bytes, not arithmetic) and the minor page faults of the epoch.
Variants whose library is not installed are left out, with a line saying what to install (Debian:
`libjemalloc2`, `libtcmalloc-minimal4`). Needs `dvc repro download` (or MNIST in data/) first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.train_speed import add_test_samples_option, ratios, run_variants, run_worker, table
from pipeline.common.allocator import ALLOCATOR_VARIABLE, DEFAULT, TOP_PAD, TRIM_THRESHOLD
from pipeline.devices.registry import host_kind
from pipeline.params.loading import load_params

BASELINE = "glibc defaults"
TUNED = "mallopt (the stages)"
LIBRARIES = {  # Debian's paths (x86-64)
    "jemalloc": ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
}


def variants() -> dict[str, dict[str, str]]:
    """Each variant's environment, added to this process's."""
    found: dict[str, dict[str, str]] = {
        BASELINE: {ALLOCATOR_VARIABLE: DEFAULT},
        TUNED: {},
        # The mmap threshold alone raised to glibc's cap (32 MiB) instead of no mmap at all, so
        # larger blocks (a batch of 1000 test images) are still mapped anew each time.
        "mmap threshold 32 MiB (MALLOC_MMAP_THRESHOLD_)": {
            "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
            "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
            "MALLOC_TOP_PAD_": str(TOP_PAD),
        },
        # c10's CPU allocator aligns blocks >= 2 MiB to 2 MiB and madvises them MADV_HUGEPAGE.
        "THP (THP_MEM_ALLOC_ENABLE=1)": {ALLOCATOR_VARIABLE: DEFAULT, "THP_MEM_ALLOC_ENABLE": "1"},
    }
    for name, (path, package) in LIBRARIES.items():
        if Path(path).exists():
            found[f"{name} (LD_PRELOAD)"] = {"LD_PRELOAD": path}
        else:
            print(f"{name}: {path} not found, left out (Debian: apt-get install {package})")
    return found


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=12_800, help="training images per epoch (default: 12800)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per variant")
    add_test_samples_option(parser)
    args = parser.parse_args(arguments)
    environments = variants()
    seed = load_params().train.seed
    print(f"{args.samples} images, {args.repeats} repeat(s) of {len(environments)} variants, each in a fresh process")
    started = time.perf_counter()
    results = run_variants(
        list(environments),
        args.repeats,
        seed,
        lambda name, run_seed: run_worker(
            "pipeline", args.samples, run_seed, host_kind().name, environments[name], test_samples=args.test_samples
        ),
    )
    print()
    print(table(results, BASELINE))
    paired = ratios(results, TUNED, BASELINE)
    print(
        f"\n{TUNED} vs {BASELINE}: {statistics.median(paired):.2f}x (min-max {min(paired):.2f}-{max(paired):.2f}x "
        f"over {len(paired)} paired repeats). {time.perf_counter() - started:.0f} s."
    )


if __name__ == "__main__":
    main()
