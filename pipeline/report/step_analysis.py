"""Why a step costs what it costs, as report text: step anatomy, kernels, achieved FLOP/s, CPU vs GPU.

Pure functions from per-combination facts (read from the profile records) to markdown and to
analysis sentences; every number they print comes from those facts. Torch-free.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.common.tables import NO_NUMBER
from pipeline.devices.registry import device_kind, device_kinds, host_kind
from pipeline.records.profile import FlopRate, ProfileRecord
from pipeline.records.quantities import Interval, KernelStats, StepAnatomy, signed_tenth
from pipeline.report.comparison import NOT_THE_TIMED_STEP, host_and_gpu_pairs, rate_interval
from pipeline.report.tables import markdown_table


def add_a_gpu_sentence(facts: Sequence[StepFacts]) -> str:
    """How to add a GPU (the first tested kind that is not the host), counting the combinations it would add (one
    per host batch size x mode profiled)."""
    host, gpu = host_kind(), next(k for k in device_kinds().values() if not k.on_host and k.support == "tested")
    count = len({(fact.batch_size, fact.mode) for fact in facts if fact.device == host.name})
    combinations = f"the {count} {gpu.name} combinations are" if count != 1 else f"the {gpu.name} combination is"
    devices = f"{host.name}, {gpu.name}"
    return (
        f"No GPU was profiled. To add one, on {gpu.where} set `profile.devices: [{devices}]` in params.yaml (or "
        f"queue it: `dvc exp run -S 'profile.devices=[{devices.replace(' ', '')}]'`) and run `dvc repro`: "
        f'{combinations} profiled beside the {host.label} ones, and the section "CPU vs GPU" compares them.'
    )


@dataclass(frozen=True)
class StepFacts:
    """What the report knows about one combination's step."""

    batch_size: int
    device: str
    mode: str
    step: Interval  # median step time timed without the profiler, with its 95 % CI (ms)
    per_sample: Interval  # the same per sample
    anatomy: StepAnatomy | None = None  # None: no trace analysis in the record
    kernels: tuple[KernelStats, ...] = ()
    rate: FlopRate | None = None
    peak_method: str = ""  # how the device's peak was measured
    untraced_ms: float | None = None  # median of the steps run untraced around the traced pass (records from format 9)
    hooks_pct: float | None = None  # the traced step over those, in %
    traced_like_timed: bool = True  # the traced pass ran like the timing processes (its anatomy and kernels count)

    @property
    def label(self) -> str:
        return f"batch {self.batch_size} {self.device} {self.mode}"

    @property
    def achieved_gflops_per_s(self) -> Interval | None:
        """FLOPs per step ÷ the timed step, with the interval from the step's (None without a FLOP count)."""
        if self.rate is None:
            return None
        return rate_interval(self.rate.flops_per_step / 1e6, self.step)  # FLOP per ms x 1e3 / 1e9 = GFLOP/s


def step_facts(records: Sequence[ProfileRecord]) -> list[StepFacts]:
    """What the report's step sections need from each profile record."""
    return [
        StepFacts(
            batch_size=record.combination.batch_size,
            device=record.combination.device,
            mode=record.combination.mode,
            step=record.timing.step_interval,
            per_sample=record.per_sample,
            anatomy=record.analysis.anatomy,
            kernels=record.analysis.top_kernels,
            rate=record.analysis.flop_rate,
            peak_method=record.analysis.peak_method,
            untraced_ms=record.trace_check.untraced_step_ms if record.trace_check else None,
            hooks_pct=record.trace_check.hooks_pct if record.trace_check else None,
            traced_like_timed=record.traced_like_timed,
        )
        for record in records
    ]


def anatomy_markdown(facts: Sequence[StepFacts]) -> str:
    """One row per combination: where the step's time goes, and the verdict with its numbers."""
    rows = [fact for fact in facts if fact.anatomy is not None]
    if not rows:
        return "_No step anatomy: the profile records carry no trace analysis (re-run `dvc repro`)._\n"
    shorter = [fact.label for fact in rows if fact.anatomy is not None and fact.anatomy.step_ms < fact.step.low]
    traced = (
        f" Here {', '.join(shorter)} traced shorter than the low end of the timed median's 95 % interval although "
        "the hooks only add: the tracing process ran faster than that median (a process's speed varies between "
        "processes and passes; where the operator table says its pass ran like the timing processes, it ran within "
        "their spread), so read the busy shares, not the two step times against each other."
        if shorter
        else " Here each row's median traced step is within or above the timed step's 95 % interval."
    )
    untraced = any(fact.untraced_ms is not None for fact in rows)
    hooks = (
        " Untraced: the median of the steps run without the profiler around the traced pass, in the same process; "
        "hooks: what the traced step took beyond it, which also holds any drift of the process's speed between "
        "them (negative where the traced steps ran faster than the untraced ones around them)."
        if untraced
        else ""
    )
    lines = [
        "Busy: on a GPU, kernels, copies and memsets running (overlaps counted once); on the CPU, time inside "
        "ATen operators. Both are measured in the traced steps (`ProfilerStep#N`), a pass of its own after the "
        "timing; the profiler's hooks add time to every operator they record." + traced + hooks,
    ]
    columns = (
        ">batch",
        "device",
        "mode",
        ">timed step ms",
        *((">untraced ms",) if untraced else ()),
        ">traced step ms",
        *((">hooks %",) if untraced else ()),
        ">busy %",
        ">idle %",
        ">kernels/step",
    )
    table = [
        (
            fact.batch_size,
            fact.device,
            fact.mode,
            f"{fact.step.value:.3f}",
            *((_ms(fact.untraced_ms),) if untraced else ()),
            f"{anatomy.step_ms:.3f}",
            *((NO_NUMBER if fact.hooks_pct is None else signed_tenth(fact.hooks_pct),) if untraced else ()),
            f"{anatomy.busy_pct:.1f}",
            f"{anatomy.idle_pct:.1f}",
            f"{anatomy.launches_per_step:.0f}" if not device_kind(fact.device).on_host else NO_NUMBER,
            f"**{anatomy.words}**",
        )
        for fact in rows
        if (anatomy := fact.anatomy) is not None
    ]
    lines.extend(["", *markdown_table((*columns, "verdict"), table)])
    lines.append("")
    lines.extend(
        f"- {fact.label}: **{fact.anatomy.words}**: {_anatomy_reason(fact.anatomy)}." for fact in rows if fact.anatomy
    )
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return NO_NUMBER if value is None else f"{value:.3f}"


def flop_rate_markdown(facts: Sequence[StepFacts]) -> str:
    rows = [fact for fact in facts if fact.rate is not None]
    if not rows:
        return "_No achieved FLOP/s: the profile records carry no step analysis (re-run `dvc repro`)._\n"
    methods = sorted({(fact.device, fact.peak_method) for fact in rows if fact.peak_method})
    lines = [
        "FLOPs per step = the model's FLOPs per sample (forward; forward + backward in training; counted by "
        "torch.utils.flop_counter as in the model summary) x batch; achieved = FLOPs per step ÷ median timed step. "
        "Matmul roof: the fastest fp32 matrix product measured once for the machine by the `roofs` stage "
        "(`hardware/roofs.json`), not the device's theoretical peak: "
        + "; ".join(f"{device}: {method}" for device, method in methods)
        + ".",
    ]
    columns = (
        ">batch",
        "device",
        "mode",
        ">MFLOPs/step",
        ">step ms",
        ">achieved GFLOP/s",
        ">matmul roof GFLOP/s",
        ">% of roof",
    )
    table = [
        (
            fact.batch_size,
            fact.device,
            fact.mode,
            f"{rate.flops_per_step / 1e6:.1f}",
            f"{rate.step_ms:.3f}",
            f"{rate.achieved_gflops_per_s:.2f}",
            f"{rate.peak_gflops_per_s:.0f}",
            f"{rate.peak_pct:.2f}",
        )
        for fact in rows
        if (rate := fact.rate) is not None
    ]
    lines.extend(["", *markdown_table(columns, table)])
    return "\n".join(lines) + "\n"


def cpu_vs_gpu_markdown(facts: Sequence[StepFacts]) -> str:
    """Per-sample time on each device per batch size and mode, and the GPU's speed-up; or how to add a GPU."""
    pairs = _device_pairs(facts)
    if not pairs:
        return add_a_gpu_sentence(facts) + "\n"
    columns = (">batch", "mode", ">cpu per-sample ms", ">gpu per-sample ms", "GPU speed-up (95 % CI)", ">GPU busy %")
    table = [
        (
            cpu.batch_size,
            cpu.mode,
            f"{cpu.per_sample.value:.4f}",
            f"{gpu.per_sample.value:.4f}",
            (cpu.per_sample / gpu.per_sample).with_interval(),
            (f"{gpu.anatomy.busy_pct:.1f}" + ("" if gpu.traced_like_timed else " ‡")) if gpu.anatomy else NO_NUMBER,
        )
        for cpu, gpu in pairs
    ]
    lines = markdown_table(columns, table)
    if any(gpu.anatomy and not gpu.traced_like_timed for _, gpu in pairs):
        lines += ["", f"‡ {NOT_THE_TIMED_STEP}"]
    return "\n".join(lines) + "\n"


def step_sentences(facts: Sequence[StepFacts]) -> list[str]:
    """Plain sentences from the anatomy, kernels, FLOP/s and the CPU vs GPU ratios. The anatomy and the kernels come
    from the traced pass: only a pass that ran like the timing processes is quoted."""
    sentences: list[str] = []
    series: dict[tuple[str, str], list[StepFacts]] = defaultdict(list)
    for fact in facts:
        series[(fact.device, fact.mode)].append(fact)
    for (device, mode), points in sorted(series.items()):
        points.sort(key=lambda fact: fact.batch_size)
        first, last = points[0], points[-1]
        traced = [fact for fact in points if fact.traced_like_timed and fact.anatomy]
        if traced:
            first_traced, last_traced = traced[0], traced[-1]
            assert first_traced.anatomy is not None and last_traced.anatomy is not None
            what = "ATen operators fill" if device_kind(device).on_host else f"the {device_kind(device).label} is busy"
            tail = (
                f"; at {last_traced.batch_size}, {last_traced.anatomy.busy_pct:.0f} %: {last_traced.anatomy.words}"
                if last_traced is not first_traced
                else ""
            )
            sentences.append(
                f"On {device} {mode} at batch {first_traced.batch_size} {what} {first_traced.anatomy.busy_pct:.0f} % "
                f"of the traced steps' time: {first_traced.anatomy.words}{tail}."
            )
        if first.rate and last.rate:
            sentences.append(_flop_rate_sentence(device, mode, first, last))
        with_kernels = [fact for fact in points if fact.traced_like_timed and fact.kernels]
        if with_kernels:
            largest = with_kernels[-1]
            top = largest.kernels[0]
            sentences.append(
                f"The top kernel of {largest.label} is {top.kernel} ({top.share_pct:.0f} % of GPU busy time, "
                f"{top.launches_per_step:g} launch(es) per step, launched by `{top.launched_by}`)."
            )
    for cpu, gpu in _device_pairs(facts):
        speed = cpu.step / gpu.step
        times = f"{gpu.step.value:.3f} vs {cpu.step.value:.3f} ms per step"
        if not speed.measurable:
            sentences.append(
                f"At batch {cpu.batch_size} {cpu.mode} {gpu.device} vs {cpu.device}: {speed.with_interval()} ({times})."
            )
        elif speed.value < 1:
            why = (
                f": the GPU idles {gpu.anatomy.idle_pct:.0f} % of the traced steps' time waiting for launches, so the "
                "host's per-operator cost, not arithmetic, sets the pace"
                if gpu.anatomy and gpu.traced_like_timed
                else ""
            )
            slower = gpu.step / cpu.step
            sentences.append(
                f"At batch {cpu.batch_size} {cpu.mode} {gpu.device} is slower than {cpu.device} ({times}; "
                f"{slower.value:.2f}x the time, 95 % CI {slower.bounds()}){why}."
            )
        else:
            sentences.append(
                f"At batch {cpu.batch_size} {cpu.mode} {gpu.device} is {speed.value:.1f}x faster than {cpu.device} "
                f"(95 % CI {speed.bounds()}; {times})."
            )
    if not _device_pairs(facts):
        sentences.append(add_a_gpu_sentence(facts))
    return sentences


def _rate_interval_words(fact: StepFacts) -> str:
    """The achieved rate's 95 % interval, from the timed step's (the rate itself is from its median)."""
    rate = fact.achieved_gflops_per_s
    if rate is None or not math.isfinite(rate.high):
        return ""
    return f" (95 % CI {rate.low:.1f}-{rate.high:.1f}, from the timed step's median and interval)"


def _flop_rate_sentence(device: str, mode: str, first: StepFacts, last: StepFacts) -> str:
    """How far the smallest and largest batch get towards the device's measured peak."""
    low, high = first.rate, last.rate
    assert low is not None
    assert high is not None
    sentence = (
        f"{device} {mode} achieves {low.achieved_gflops_per_s:.1f} GFLOP/s at batch {first.batch_size}"
        f"{_rate_interval_words(first)} ({low.peak_pct:.1f} % of the {low.peak_gflops_per_s:.0f} GFLOP/s matmul "
        "roof, the fastest fp32 matrix product the `roofs` stage measured at the profile's thread count, not the "
        "device's theoretical peak)"
    )
    if last is not first:
        sentence += (
            f" and {high.achieved_gflops_per_s:.1f} GFLOP/s at batch {last.batch_size}{_rate_interval_words(last)} "
            f"({high.peak_pct:.1f} %)"
        )
    if max(low.peak_pct, high.peak_pct) >= 25:
        return sentence + "."
    if last.anatomy is None:
        return sentence + ": far below the ceiling."
    if last.anatomy.host_bound:
        why = (
            "most of the step is Python and framework code between operators"
            if device_kind(last.device).on_host
            else "the device waits for the host"
        )
        return sentence + f": far below the ceiling because {why} (see the anatomy)."
    return (
        sentence + ": far below the roof although the step is spent inside operators; the operator tables and the "
        "roofline below show which operators hold it back."
    )


def has_gpu_pairs(facts: Sequence[StepFacts]) -> bool:
    """Whether some batch size and mode was profiled on both the CPU and a GPU."""
    return bool(_device_pairs(facts))


def _device_pairs(facts: Sequence[StepFacts]) -> list[tuple[StepFacts, StepFacts]]:
    """(host, gpu) facts of the same batch size and mode, in batch then mode order: the host kind's (the CPU)
    against each kind that computes off the host."""
    return sorted(host_and_gpu_pairs(facts), key=lambda pair: (pair[0].batch_size, pair[0].mode))


def _anatomy_reason(anatomy: StepAnatomy) -> str:
    """The numbers behind the verdict, in this version's words whatever the record says (older records named the
    median step beside a share of the mean one)."""
    return anatomy.explained(device_kind(anatomy.device).on_host)
