"""Where the project is, as the tests see it: its root, its params.yaml and the interpreter's bin folder; and a
Python snippet run there in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
REPO_PARAMS: dict[str, Any] = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())  # never modify: copy
# The project's own GPU run: a fresh `dvc repro` with profile.devices [cpu, cuda] on an H100 (its README says how).
GPU_RUN = REPO_ROOT / "tests" / "data" / "gpu" / "h100-2026-11-27"


def run_python(script: str, *arguments: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -c script arguments` in a fresh interpreter from the repository root: stdin empty, output captured,
    at most 5 minutes."""
    return subprocess.run(
        [sys.executable, "-c", script, *arguments],
        check=False,
        cwd=REPO_ROOT,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
