"""Trace analysis: operators ranked once, kernels named and attributed, GPU idle time, step verdicts.

Three kinds of input: the real H100 traces of the GPU reference run (parsed once per test run; checked
against numbers computed here straight from the raw events), a real CPU trace profiled here, and a
tiny hand-written trace whose answers are known exactly.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.model.network import LabNet
from pipeline.model.summary import summarize
from pipeline.profiling.run import count_step_flops, profile_combination
from pipeline.profiling.trace_analysis import (
    OPERATOR_NAME,
    CountedCall,
    Trace,
    analyse_trace,
    read_trace,
    short_kernel_name,
)
from pipeline.profiling.worker import build_step, make_step
from pipeline.records.profile import Combination
from tests.helpers.data import LAB_MODEL
from tests.helpers.repo import GPU_RUN, REPO_ROOT

# The cuda traces of the project's first H100 run, committed with their records and tables
# (tests/data/h100-2026-11-22/README.md says how it was made); the later run's are in tests/data/gpu/.
REFERENCE = REPO_ROOT / "tests" / "data" / "h100-2026-11-22"
# Kernel time / ProfilerStep span of those traces, computed once with `independent_kernel_share` below.
README_BUSY_PCT = {"1-cuda-inference": 3.8, "64-cuda-inference": 19.4, "1-cuda-train": 7.2, "64-cuda-train": 9.7}
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def reference_trace(name: str) -> Path:
    """The committed reference trace of combination `name` (only read: never written, so never copied)."""
    source = REFERENCE / "profiles" / name / "trace.json.gz"
    if not source.is_file():
        pytest.fail(f"GPU reference trace not found at {source}")
    return source


@functools.cache
def reference(name: str) -> Trace:
    """`read_trace` of the reference trace of combination `name`, parsed once per test run: several tests read
    each one, and a Trace (tuples of frozen events) cannot be changed by the analyses they run on it."""
    return read_trace(reference_trace(name))


def raw_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as handle:
        events: list[dict[str, Any]] = json.load(handle)["traceEvents"]
    return events


def independent_kernel_share(events: list[dict[str, Any]]) -> float:
    """The README's definition, from raw events: sum of kernel durations inside the steps / sum of step spans."""
    # The CPU-side step ranges: newer traces repeat them on the GPU timeline as `gpu_user_annotation`.
    steps = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    inside = sum(k["dur"] for k in kernels if any(s["ts"] <= k["ts"] < s["ts"] + s["dur"] for s in steps))
    return 100.0 * float(inside) / float(sum(s["dur"] for s in steps))


@pytest.mark.parametrize("name", sorted(README_BUSY_PCT))
def test_gpu_busy_matches_the_raw_kernel_time_and_the_reference_readme(name: str) -> None:
    analysis = analyse_trace(reference(name), "cuda")
    expected = independent_kernel_share(raw_events(reference_trace(name)))
    # Busy also counts copies/memsets and counts overlapping kernels once: within half a point of kernel time.
    assert analysis.anatomy.busy_pct == pytest.approx(expected, abs=0.5)
    assert analysis.anatomy.busy_pct == pytest.approx(README_BUSY_PCT[name], abs=1.0)
    assert analysis.anatomy.idle_pct == pytest.approx(100.0 - analysis.anatomy.busy_pct)
    assert analysis.anatomy.verdict == "host-bound"
    assert "idle" in analysis.anatomy.reason
    assert analysis.anatomy.traced_steps == 30


@pytest.mark.parametrize("name", sorted(README_BUSY_PCT))
def test_cuda_ranking_holds_operators_only_and_counts_each_kernel_once(name: str) -> None:
    analysis = analyse_trace(reference(name), "cuda")
    names = [row.operator for row in analysis.operators]
    assert all(OPERATOR_NAME.match(operator) for operator in names), [n for n in names if not OPERATOR_NAME.match(n)]
    assert not any(n.startswith(("ProfilerStep", "Optimizer.", "sm")) or "kernel" in n for n in names)
    assert sum(row.share_pct for row in analysis.operators) == pytest.approx(100.0)
    shares = [row.share_pct for row in analysis.operators]
    assert shares == sorted(shares, reverse=True)
    # Ranked GPU time + time launched outside any operator == all device time of the steps, once.
    ranked = sum(row.self_device_ms for row in analysis.operators)
    kernels = sum(row.device_ms for row in analysis.kernels)
    assert ranked + analysis.unattributed_device_ms == pytest.approx(kernels)
    assert analysis.anatomy.busy_ms <= kernels + 1e-9


def test_train_lists_the_optimizer_range_apart_with_the_kernels_inside_it() -> None:
    analysis = analyse_trace(reference("1-cuda-train"), "cuda")
    ranges = {row.name: row for row in analysis.ranges}
    optimizer = ranges["Optimizer.step#Adadelta.step"]
    assert optimizer.calls_per_step == 1
    assert optimizer.device_ms > 0
    foreach = [row for row in analysis.operators if row.operator.startswith("aten::_foreach_")]
    assert foreach
    assert sum(row.self_device_ms for row in foreach) == pytest.approx(optimizer.device_ms, rel=0.05)
    updates = [row for row in analysis.kernels if row.kernel.startswith("optimizer multi-tensor update")]
    assert updates
    assert all(row.launched_by.startswith("aten::_foreach_") for row in updates)
    assert all("multi_tensor_apply_kernel" in row.full_name for row in updates)


def test_kernel_table_names_gemms_convolutions_and_their_operators() -> None:
    analysis = analyse_trace(reference("64-cuda-inference"), "cuda")
    kernels = analysis.kernels
    assert sum(row.share_pct for row in kernels) == pytest.approx(100.0)
    assert [row.device_ms for row in kernels] == sorted((row.device_ms for row in kernels), reverse=True)
    gemm = next(row for row in kernels if row.kernel.startswith("cuBLAS GEMM"))
    assert "aten::addmm" in gemm.launched_by
    assert "xmma_gemm" in gemm.full_name
    conv = next(row for row in kernels if row.kernel.startswith("cuDNN convolution"))
    assert "aten::cudnn_convolution" in conv.launched_by
    # One forward: 2 linear layers, 2 convolutions, 1 pooling per step.
    assert gemm.launches_per_step >= 1
    assert sum(r.launches_per_step for r in kernels if "pooling" in r.kernel) == 1
    # The same kernels' per-step GPU time that key_averages() put in the committed table (its kernel rows).
    committed = {
        row["operator"]: float(row["self_device_ms"])
        for row in csv.DictReader((REFERENCE / "profiles/64-cuda-inference/top_operators.csv").read_text().splitlines())
    }
    for row in kernels:
        if row.full_name in committed:
            assert row.device_ms == pytest.approx(committed[row.full_name], rel=0.02, abs=2e-4), row.kernel


def test_short_kernel_names_read_the_real_h100_kernels() -> None:
    """The kernel tables of the project's GPU run: each full name shortens to the name its table shows."""
    shown = {}
    for table in (GPU_RUN / "profiles" / "cuda").glob("*/top_kernels.csv"):
        shown |= {row["full_name"]: row["kernel"] for row in csv.DictReader(table.read_text().splitlines())}
    kernels = {name: short_kernel_name(name) for name in shown if not OPERATOR_NAME.match(name) and "#" not in name}
    assert len(kernels) >= 10, "the GPU run's kernel tables list too few kernels"
    assert all(shown[full] == short for full, short in kernels.items())
    for full, short in kernels.items():
        assert len(short) <= 60, full
        assert short != full or len(full) <= 30, full  # a long generated name is always shortened
    by_prefix = {full.split("_")[0]: short for full, short in kernels.items()}
    gemms = [short for full, short in kernels.items() if "xmma_gemm" in full]
    assert gemms
    assert all(short.startswith("cuBLAS GEMM (sm") for short in gemms)
    convolutions = [short for full, short in kernels.items() if "fprop" in full]
    assert convolutions
    assert all(s.startswith("cuDNN convolution") and "TF32" in s for s in convolutions)
    assert any(s == "optimizer multi-tensor update (sqrt)" for s in kernels.values()), by_prefix


@pytest.mark.parametrize(
    ("full", "short"),
    [
        (
            "sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32_cudnn",
            "cuDNN convolution weight gradient (sm90, TF32)",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
            "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
            "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, ...>)",
            "reduction (sum)",
        ),
        # cuBLAS kernels that are not the GEMM itself, as the H100 run's batch 1 and 64 inference launched them.
        (
            "void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensorStridedBatched<float const>, "
            "cublasGemvTensorStridedBatched<float> > >(cublasDotParams<...>)",
            "cuBLAS dot product",
        ),
        (
            "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, "
            "true, true, false, 7, false, cublasGemvParamsEx<int, ...> >(cublasGemvParamsEx<int, ...>)",
            "cuBLAS GEMV (matrix-vector)",
        ),
        (
            "void reduce_1Block_kernel<float, 128, 7, cublasGemvTensorStridedBatched<float>, ...>(float const*, ...)",
            "cuBLAS reduction",
        ),
        (
            "void cublasLt::epilogue::impl::globalKernel<8, 32, float, float, float, true, true, 1>(int, long, ...)",
            "cuBLASLt epilogue",
        ),
        ("void scal_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, ...)", "cuBLAS scale"),
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(cutlass_80_simt_sgemm_64x64_8x5_tn_align1"
            "::Params)",
            "cuBLAS GEMM",
        ),
        # cuDNN's helpers around a convolution's backward pass.
        (
            "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::"
            "wgrad_indexed::Warp_specialized_params<...> >(...)",
            "cuDNN workspace initialisation",
        ),
        (
            "void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<cutlass__5x_cudnn::"
            "MatrixShape<4, 128>, ...> >(...)",
            "cuDNN split-K reduction",
        ),
        (
            "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
            "(cudnnKernelDataType_t)2>(...)",
            "cuDNN layout conversion",
        ),
        (
            "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, at::native::"
            "templates::cuda::uniform_and_transform<float, float, at::CUDAGeneratorImpl*, at::native::templates::cuda::"
            "uniform_kernel<at::CUDAGeneratorImpl*>(...)",
            "random numbers",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
        ("void at::native::(anonymous namespace)::unknown_thing<float>(float*, int)", "unknown_thing"),
    ],
)
def test_short_kernel_name_rules(full: str, short: str) -> None:
    assert short_kernel_name(full) == short


@pytest.mark.slow  # a real training step profiled in process: seconds
def test_cpu_trace_ranks_operators_and_measures_time_inside_them(tmp_path: Path) -> None:
    """A real CPU training step profiled here: the optimizer range is listed apart, busy = time inside ATen."""
    model = LabNet(LAB_MODEL)
    images, labels = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    trace_path = tmp_path / "trace.json.gz"
    step = build_step(model, "train", images, labels, lr=1.0)
    profile_combination(
        Combination(16, "cpu", "train"),
        step,
        torch.device("cpu"),
        2,
        3,
        trace_path,
        ci_target_pct=50.0,
        time_budget_s=0.5,
    )

    # fc1's and fc2's forward, as counted; the hand-made numbers land on the two addmm calls of each step.
    analysis = analyse_trace(
        read_trace(trace_path), "cpu", (CountedCall("aten::addmm", 0.6e6), CountedCall("aten::addmm", 0.4e6))
    )
    names = [row.operator for row in analysis.operators]
    assert names
    assert all(name.startswith("aten::") for name in names)
    assert "Optimizer.step#Adadelta.step" in {row.name for row in analysis.ranges}
    assert sum(row.share_pct for row in analysis.operators) == pytest.approx(100.0)
    assert not analysis.kernels
    assert analysis.unattributed_device_ms == 0
    addmm = next(row for row in analysis.operators if row.operator == "aten::addmm")
    assert addmm.mflops == pytest.approx(1.0)
    assert addmm.calls_per_step == 2
    # Allocated MB: fc1's and fc2's outputs (16 x 128 and 16 x 10 floats) are addmm's own; what a tensor factory
    # allocates inside an operator counts for that operator, so only the factories Python calls keep theirs: the
    # dropouts' `empty_like` buffers (16 x 64 x 12 x 12 and 16 x 128 floats). All of it is the trace's allocations.
    assert addmm.allocated_mb == pytest.approx(16 * (128 + 10) * 4 / 1e6)
    rows = {row.operator: row for row in analysis.operators}
    assert rows["aten::empty_like"].allocated_mb == pytest.approx(16 * (64 * 12 * 12 + 128) * 4 / 1e6)
    assert "aten::empty" not in rows or rows["aten::empty"].allocated_mb == 0
    allocated = [
        e["args"]["Bytes"]
        for e in raw_events(trace_path)
        if e.get("name") == "[memory]" and e["args"]["Bytes"] > 0 and e["args"]["Device Type"] == 0
    ]
    assert sum(row.allocated_mb for row in analysis.operators) <= sum(allocated) / 3 / 1e6 + 1e-9
    assert sum(row.allocated_mb for row in analysis.operators) > 0.9 * sum(allocated) / 3 / 1e6
    # Time inside operators, independently: the union of top-level aten:: intervals within each step.
    events = raw_events(trace_path)
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    operators = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")
    )
    inside, reach = 0.0, 0.0
    for start, end in operators:
        if any(s["ts"] <= start < s["ts"] + s["dur"] for s in steps) and end > reach:
            inside += end - max(start, reach)
            reach = end
    expected = 100.0 * inside / sum(s["dur"] for s in steps)
    anatomy = analysis.anatomy
    assert anatomy.busy_pct == pytest.approx(expected, abs=0.5)
    assert 0 < anatomy.busy_pct < 100
    assert anatomy.traced_steps == 3
    assert anatomy.launches_per_step == 0
    # Every ATen call inside the steps, wrappers included: the calls the profiler's hooks run on.
    calls = [e for e in operators if any(s["ts"] <= e[0] < s["ts"] + s["dur"] for s in steps)]
    assert anatomy.operator_calls_per_step == len(calls) / 3 == sum(row.calls_per_step for row in analysis.operators)
    # On a CPU there is no second device to wait for: the words say where the step's time goes.
    assert anatomy.verdict == ("overhead-bound" if anatomy.busy_pct < 50 else "operator-bound") == anatomy.words
    assert "inside ATen operators" in anatomy.reason


@pytest.mark.parametrize("name", ["1-cuda-inference", "1-cuda-train", "64-cuda-inference", "64-cuda-train"])
def test_h100_trace_credits_flops_to_cudnn_and_backward_and_adds_up_to_the_model(name: str) -> None:
    """The real H100 traces with FLOPs counted here, on the CPU, for the same model and batch (same shapes, same
    formulas): the cuDNN call carries the forward convolutions, `aten::convolution_backward` the backward ones,
    wrappers carry none, and the operators' FLOPs sum to the model summary's FLOPs per step."""
    batch_text, _, mode = name.split("-")
    batch = int(batch_text)
    model = LabNet(LAB_MODEL)
    summary = summarize(model, model.input_shape)
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    calls = count_step_flops(
        make_step(model, "inference" if mode == "inference" else "train", images, labels, 1.0)
    ).calls
    analysis = analyse_trace(reference(name), "cuda", calls)

    rows = {row.operator: row for row in analysis.operators}
    conv_forward = batch * sum(row.flops_per_sample for row in summary.rows if row.kind == "Conv2d") / 1e6
    assert rows["aten::cudnn_convolution"].mflops == pytest.approx(conv_forward, rel=1e-9)
    assert rows["aten::cudnn_convolution"].self_device_ms > 0  # the row that launched the convolution kernels
    for wrapper in ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::linear"):
        assert rows[wrapper].mflops is None, wrapper
    assert rows["aten::relu"].mflops is None  # element-wise: no formula
    per_sample = summary.forward_flops_per_sample if mode == "inference" else summary.training_flops_per_sample
    attributed = sum(row.mflops for row in analysis.operators if row.mflops is not None)
    assert attributed == pytest.approx(per_sample * batch / 1e6, rel=1e-9)
    # The bytes go where the FLOPs go: the forward convolutions' tensors on the cuDNN row, nothing on wrappers.
    forward_bytes = sum(call.bytes for call in calls if call.operator == "aten::convolution") / 1e6
    assert rows["aten::cudnn_convolution"].mbytes == pytest.approx(forward_bytes, rel=1e-9)
    assert rows["aten::conv2d"].mbytes is None
    moved = sum(row.mbytes for row in analysis.operators if row.mbytes is not None)
    assert moved == pytest.approx(sum(call.bytes for call in calls) / 1e6, rel=1e-9)
    if mode == "train":
        backward = sum(call.flops for call in calls if call.operator == "aten::convolution_backward") / 1e6
        assert backward > conv_forward  # weight and input gradients of conv2, weight gradient of conv1
        assert rows["aten::convolution_backward"].mflops == pytest.approx(backward, rel=1e-9)
        assert rows["aten::mm"].mflops == pytest.approx(2 * rows["aten::addmm"].mflops, rel=1e-9)  # two grads each
    else:
        assert "aten::convolution_backward" not in rows


def test_flops_follow_the_one_implementing_child_and_stay_put_when_calls_do_not_match(tmp_path: Path) -> None:
    """Hand-made: a convolution whose chain forks at a bias add keeps to the conv kernel; an operator whose
    traced calls outnumber the counted ones keeps its FLOPs on its own row (the total is never lost)."""
    events: list[dict[str, Any]] = []
    for step, base in enumerate((1000.0, 1200.0)):
        events += [
            _event(f"ProfilerStep#{step + 2}", "user_annotation", base, 200),
            _event("aten::conv2d", "cpu_op", base + 1, 50),
            _event("aten::convolution", "cpu_op", base + 2, 48),
            _event("aten::_convolution", "cpu_op", base + 3, 46),
            _event("aten::thnn_conv2d", "cpu_op", base + 4, 30),
            _event("aten::_slow_conv2d_forward", "cpu_op", base + 5, 28),
            _event("aten::add_", "cpu_op", base + 40, 5),
            _event("aten::convolution", "cpu_op", base + 60, 40),
            _event("aten::_convolution", "cpu_op", base + 61, 38),
            _event("aten::mkldnn_convolution", "cpu_op", base + 62, 30),
            _event("aten::mm", "cpu_op", base + 110, 10),
            _event("aten::mm", "cpu_op", base + 130, 10),  # counted once below: a mismatch
        ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    calls = (
        CountedCall("aten::convolution", 1e6),
        CountedCall("aten::convolution", 3e6),
        CountedCall("aten::mm", 5e6),
    )
    rows = {row.operator: row for row in analyse_trace(read_trace(path), "cpu", calls).operators}
    assert rows["aten::_slow_conv2d_forward"].mflops == pytest.approx(1.0)  # the first call's, per step
    assert rows["aten::mkldnn_convolution"].mflops == pytest.approx(3.0)
    assert rows["aten::mm"].mflops == pytest.approx(5.0)  # 2 traced calls for 1 counted: not split, not lost
    for name in ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::thnn_conv2d", "aten::add_"):
        assert rows[name].mflops is None, name


def _event(
    name: str, cat: str, ts: float, dur: float, tid: int = 1, correlation: int | None = None, external: int = 0
) -> dict[str, Any]:
    args: dict[str, int] = {"correlation": correlation} if correlation is not None else {}
    if external:
        args["External id"] = external
    pid = 0 if cat in DEVICE_CATEGORIES else 100
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_hand_written_trace_gives_the_known_answers(tmp_path: Path) -> None:
    """Two 100 µs steps. Each: an optimizer range holding a foreach op (one 10 µs kernel), an addmm whose
    GEMM (30 µs) overlaps a 10 µs copy by 5 µs, a kernel launched by no operator (5 µs), and a 5 µs kernel
    whose launch call is missing but whose External id names the addmm."""
    events: list[dict[str, Any]] = []
    for step, base in enumerate((1000.0, 1100.0)):
        c = 10 * step
        events += [
            _event(f"ProfilerStep#{step + 2}", "user_annotation", base, 100),
            _event("Optimizer.step#Adadelta.step", "user_annotation", base + 5, 20),
            _event("aten::_foreach_mul_", "cpu_op", base + 6, 10),
            _event("cudaLaunchKernel", "cuda_runtime", base + 7, 2, correlation=c + 1),
            _event("aten::linear", "cpu_op", base + 30, 20),
            _event("aten::addmm", "cpu_op", base + 31, 15, external=50 + step),
            _event("cuLaunchKernel", "cuda_driver", base + 32, 3, correlation=c + 2),
            _event("cudaMemcpyAsync", "cuda_runtime", base + 40, 2, correlation=c + 3),
            _event("cudaLaunchKernel", "cuda_runtime", base + 60, 2, correlation=c + 4),
            _event("cudaDeviceSynchronize", "cuda_runtime", base + 86, 10, correlation=c + 5),  # waits: no launch
            _event(
                "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<Sqrt>()",
                "kernel",
                base + 10,
                10,
                7,
                c + 1,
            ),
            _event("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_cublas", "kernel", base + 40, 30, 7, c + 2),
            _event("Memcpy DtoD (Device -> Device)", "gpu_memcpy", base + 65, 10, 8, c + 3),
            _event("void at::native::elementwise_kernel<CUDAFunctor_add<float>>()", "kernel", base + 80, 5, 7, c + 4),
            _event("void at::native::reduce_kernel<sum_functor<float>>()", "kernel", base + 90, 5, 7, c + 9, 50 + step),
        ]
    events.append(_event("aten::relu", "cpu_op", 5000, 10))  # outside every step: ignored
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))

    analysis = analyse_trace(read_trace(path), "cuda")
    rows = {row.operator: row for row in analysis.operators}
    assert set(rows) == {"aten::_foreach_mul_", "aten::linear", "aten::addmm"}
    assert rows["aten::addmm"].self_device_ms == pytest.approx(0.045)  # GEMM + copy + reduction, per step
    assert rows["aten::linear"].self_device_ms == 0
    assert rows["aten::linear"].total_device_ms == pytest.approx(0.045)
    assert rows["aten::linear"].self_cpu_ms == pytest.approx(0.005)
    assert rows["aten::addmm"].self_cpu_ms == pytest.approx(0.015)
    assert rows["aten::addmm"].share_pct == pytest.approx(100 * 45 / 55)
    assert rows["aten::_foreach_mul_"].share_pct == pytest.approx(100 * 10 / 55)
    assert analysis.unattributed_device_ms == pytest.approx(0.005)
    (optimizer,) = analysis.ranges
    assert optimizer.device_ms == pytest.approx(0.010)
    assert optimizer.cpu_ms == pytest.approx(0.020)
    kernels = {row.kernel: row for row in analysis.kernels}
    assert kernels["cuBLAS GEMM (sm90)"].launched_by == "aten::addmm"
    assert kernels["cuBLAS GEMM (sm90)"].share_pct == pytest.approx(100 * 30 / 60)
    assert kernels["elementwise (add)"].launched_by == "(no operator)"
    assert kernels["reduction (sum)"].launched_by == "aten::addmm"
    anatomy = analysis.anatomy
    assert anatomy.busy_ms == pytest.approx(0.055)  # 10 + (30 + 10 - 5 overlap) + 5 + 5 µs
    assert anatomy.busy_pct == pytest.approx(55.0)
    assert anatomy.verdict == anatomy.words == "GPU-bound" and not anatomy.host_bound
    assert anatomy.launches_per_step == 5
    assert anatomy.launch_call_ms == pytest.approx(0.009)
    assert anatomy.operator_calls_per_step == 3  # _foreach_mul_, linear, addmm; the one outside every step is not
    assert anatomy.step_ms == pytest.approx(0.1)


def test_on_the_cpu_the_update_is_its_ranges_span_and_outside_the_rest(tmp_path: Path) -> None:
    """Two 100 µs steps on the CPU. Each: `zero_grad` (2 µs), a forward `addmm` (30 µs), then `Optimizer.step` (40 µs)
    holding two 5 µs operators: the update's 30 µs between them (its loop over the parameters) is its own time, not
    the step's time outside operators; `zero_grad` is not the update (the step without the update clears the
    gradients too), and its range holds no operator: its 2 µs are outside operators."""
    events: list[dict[str, Any]] = []
    for step, base in enumerate((1000.0, 1100.0)):
        events += [
            _event(f"ProfilerStep#{step + 2}", "user_annotation", base, 100),
            _event("Optimizer.zero_grad#Adadelta.zero_grad", "user_annotation", base + 1, 2),
            _event("aten::addmm", "cpu_op", base + 10, 30),
            _event("Optimizer.step#Adadelta.step", "user_annotation", base + 50, 40),
            _event("aten::sqrt_", "cpu_op", base + 55, 5),
            _event("aten::addcmul_", "cpu_op", base + 75, 5),
        ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))

    parts = {(part.phase, part.group): part.step_ms for part in analyse_trace(read_trace(path), "cpu").parts}
    assert parts[("optimizer", "optimizer")] == pytest.approx((0.040, 0.040))  # the step's range, not 10 µs of ops
    assert parts[("forward", "linear")] == pytest.approx((0.030, 0.030))
    assert parts[("outside", "outside")] == pytest.approx((0.030, 0.030))  # 100 - 40 - 30
    assert sum(sum(times) for times in parts.values()) == pytest.approx(0.2)


def test_unreadable_or_stepless_traces_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="is missing"):
        read_trace(tmp_path / "absent.json.gz")
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(PipelineError, match="not a readable Chrome trace"):
        read_trace(broken)
    stepless = tmp_path / "stepless.json"
    stepless.write_text(json.dumps({"traceEvents": [_event("aten::relu", "cpu_op", 0, 1)]}))
    with pytest.raises(PipelineError, match="no `ProfilerStep#N` ranges"):
        read_trace(stepless)


def test_counted_calls_carry_the_bytes_of_their_tensors_and_the_step_all_operators_bytes() -> None:
    """conv1 at batch 1: input, weight, bias and output, fp32, counted exactly; the step's bytes add every
    operator's tensors (more than the counted calls alone) and views move nothing."""
    model = LabNet(LAB_MODEL).eval()
    conv1 = model.features[0]
    images = torch.randn(1, 1, 28, 28)
    work = count_step_flops(make_step(model, "inference", images, torch.zeros(1, dtype=torch.int64), 1.0))
    first = work.calls[0]
    assert first.operator == "aten::convolution"
    with torch.no_grad():
        out = conv1(images)
    expected = 4 * (images.numel() + conv1.weight.numel() + conv1.bias.numel() + out.numel())
    assert first.bytes == expected
    assert work.bytes_per_step > sum(call.bytes for call in work.calls)  # relu, pooling, log_softmax ... too

    def views_then_add() -> None:
        x = torch.ones(1000)  # writes 4,000 bytes
        y = x.view(10, 100).t()  # two views: nothing moved
        _ = y + 1  # reads 4,000 and writes 4,000

    assert count_step_flops(views_then_add).bytes_per_step == 12_000
