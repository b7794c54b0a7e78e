"""The allocator set-up every torch stage makes (pipeline.common.allocator): what it decides from the environment,
that glibc really serves a batch-sized buffer differently afterwards, and a clear error for a bad request.

The set-up is process-wide and made once, so every check of its effect runs in a fresh interpreter."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.common.allocator import ALLOCATOR_VARIABLE, plan_allocator
from pipeline.common.errors import PipelineError
from tests.helpers.repo import REPO_ROOT

# conv2's output at batch 64 (64 x 64 x 24 x 24 float32): above glibc's initial 128 KiB mmap threshold.
ACTIVATION_BYTES = 64 * 64 * 24 * 24 * 4

PROBE = f"""
import ctypes, json
from pipeline.common.allocator import current_allocator, tune_allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before = current_allocator().kind
setup = tune_allocator()
mapped = libc.mallinfo2().hblks
block = libc.malloc({ACTIVATION_BYTES})
mapped = libc.mallinfo2().hblks - mapped  # 1: glibc gave the buffer its own mmap; 0: it came from the heap
libc.free(block)
print(json.dumps({{"before": before, "kind": setup.kind, "description": setup.description, "mapped": mapped,
                  "again": tune_allocator() == setup}}))
"""


def probe(environment: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_tuned_process_keeps_a_batch_sized_buffer_on_the_heap() -> None:
    tuned = probe({})
    assert tuned["before"] == "default" and tuned["kind"] == "tuned" and tuned["again"] is True
    assert tuned["mapped"] == 0, tuned
    assert str(tuned["description"]).startswith("glibc ") and "tuned: no mmap" in str(tuned["description"])


def test_default_request_leaves_glibc_mapping_the_buffer_on_its_own() -> None:
    default = probe({ALLOCATOR_VARIABLE: "default"})
    assert default["kind"] == "default" and default["mapped"] == 1, default
    assert "defaults" in str(default["description"])


def test_the_users_own_glibc_settings_are_left_alone_and_named() -> None:
    chosen = probe({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert chosen["kind"] == "environment" and chosen["mapped"] == 1, chosen
    assert "MALLOC_MMAP_THRESHOLD_=65536" in str(chosen["description"])


@pytest.mark.parametrize(
    ("environment", "kind", "named"),
    [
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "preloaded", "jemalloc"),
        ({"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4"}, "preloaded", "tcmalloc"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "environment", "GLIBC_TUNABLES="),
        ({ALLOCATOR_VARIABLE: " tuned "}, "tuned", "tuned: no mmap"),
        ({}, "tuned", "top pad 256 MiB"),
    ],
)
def test_plan_follows_the_environment(environment: dict[str, str], kind: str, named: str) -> None:
    plan = plan_allocator(environment)
    assert plan.kind == kind and named in plan.description


def test_a_bad_request_names_the_variable_and_the_fix() -> None:
    with pytest.raises(PipelineError, match=r"\$LAB_ALLOCATOR is 'fast'; it must be `tuned` .* or `default`"):
        plan_allocator({ALLOCATOR_VARIABLE: "fast"})


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_a_stage_started_with_a_bad_request_stops_with_one_paragraph(tmp_path: Path) -> None:
    for name in ("pipeline", "stages"):
        shutil.copytree(REPO_ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "params.yaml", tmp_path / "params.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "stages.export_graph"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", ALLOCATOR_VARIABLE: "fast"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "error in stage 'export_graph': $LAB_ALLOCATOR is 'fast'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "graph" / "model.onnx").exists()
