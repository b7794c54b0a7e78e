"""What each DVC stage pays to start, and what its work takes: `dvc repro -f -s <stage>` timed, stage by stage.

    python -m benchmarks.stage_costs [--repeats 3] [--stages validate download ...]

Run in a reproduced project (after `dvc repro`): each stage is forced to run again, so it rewrites its own outputs
(the same ones, where the stage is deterministic on this machine) and logs one more MLflow run. `train` is left out
unless named (it trains again).

Each stage process notes its moments in $LAB_TIMELINE (pipeline.common.interrupts.note_moment), each with its age
from the kernel's record of its start. Per stage it prints the median and range over `--repeats` of:

- `dvc repro`: the whole command's wall time (DVC's own start, its hashing and lock update included);
- `imports`: from the stage process's start to the end of its module imports (the `imported` moment);
- `to work`: from its start to its first moment of real work (the first moment after `imported` that the stage
  notes: a loaded model, a started run, a forked timing server), where it notes one;
- `stage`: from its start to the end of its `main` (`main-returned`);

against a reference measured in the same run, in turn with the stages: `python -c "import torch"`, the import every
torch stage pays. Writes only what the stages write.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.common.machine import cpu_model, machine_fingerprint
from pipeline.common.paths import MODEL_CHECKPOINT
from pipeline.records.statistics import available_cores

STAGES = ("validate", "download", "export_graph", "roofs", "profile@cpu", "report")
REFERENCE = [sys.executable, "-c", "import torch"]


def moments(path: Path) -> dict[str, float]:
    """The first time each moment was noted in a timeline file: {moment: seconds since the process started}."""
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            _, moment, seconds = line.split()
            found.setdefault(moment, float(seconds))
    return found


def timed(command: list[str], environment: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})" if values else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 21), metavar="1-20")
    parser.add_argument("--stages", nargs="+", default=list(STAGES))
    args = parser.parse_args()
    if not MODEL_CHECKPOINT.exists():
        raise SystemExit(f"{MODEL_CHECKPOINT} is missing: run `dvc repro` first.")
    fingerprint = machine_fingerprint()
    print(
        f"machine: {cpu_model()} ({fingerprint['cpu_family_model']}; {fingerprint['cpu_features']}), "
        f"{available_cores()} cores; load average at start {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    reference: list[float] = []
    results: dict[str, dict[str, list[float]]] = {
        stage: {"repro": [], "imports": [], "to work": [], "stage": []} for stage in args.stages
    }
    with tempfile.TemporaryDirectory(prefix="stage-costs-") as scratch:
        for repeat in range(args.repeats):
            reference.append(timed(REFERENCE, dict(os.environ)))
            for stage in args.stages:
                timeline = Path(scratch) / f"{stage}-{repeat}.txt"
                environment = {**os.environ, "LAB_TIMELINE": str(timeline)}
                found = results[stage]
                found["repro"].append(timed(["dvc", "repro", "-f", "-s", stage], environment))
                noted = moments(timeline)
                found["imports"] += [noted["imported"]] if "imported" in noted else []
                after = [
                    seconds
                    for moment, seconds in noted.items()
                    if moment not in ("start-up", "imported", "main-returned") and seconds > noted.get("imported", 0)
                ]
                found["to work"] += [min(after)] if after else []
                found["stage"] += [noted["main-returned"]] if "main-returned" in noted else []
                print(f"repeat {repeat + 1}: {stage} {found['repro'][-1]:.1f} s", file=sys.stderr, flush=True)
    base = statistics.median(reference)
    print(f"\nreference, `python -c 'import torch'`: {spread(reference)} s over {args.repeats} repeats\n")
    print("| stage | `dvc repro -f -s`, s | imports, s | to first work, s | stage process, s | repro ÷ reference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for stage, found in results.items():
        print(
            f"| {stage} | {spread(found['repro'])} | {spread(found['imports'])} | {spread(found['to work'])} | "
            f"{spread(found['stage'])} | {statistics.median(found['repro']) / base:.1f} |"
        )
    print(f"\nload average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
