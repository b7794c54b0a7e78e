"""The analysis's opening: the few sentences a student takes away in half a minute, before the findings that back
them (pipeline.report.findings). Each sentence restates a finding's rule or a paired ratio's direction, shorter and
with its numbers rounded for reading; none decides anything the findings do not, and where they say nothing, the
conclusion leaves that sentence out.

1. How the time per sample changes from the smallest to the largest batch, per device and mode (paired timing; the
   same rule as `per_sample_direction`: a direction only where the interval excludes 1).
2. Why: the parts paid per step, not per sample, with their share of the smallest batch's step, and the parts that
   grow with the samples (`per_step_or_per_sample`), for the device and mode where those parts fill most of it;
   before them, the Adadelta update where its time, timed without a profiler, is paid per step (`update_per_step`).
3. Training against inference: the paired ratio at the smallest and largest batch; "the smaller the batch, the
   larger the gap" only where the two intervals do not meet; the Adadelta update's share of the small batch's
   training step, where its parts were timed (the full step over the step without the update wholly above 1), else
   how much of the small batch's gap the update makes, only where `train_against_inference` found the traced pass
   like the timed steps and the ratio without the update lies wholly below the ratio with it.
4. Closer to the roof: the group whose share of the measured matmul roof grew most (`closer_to_roof`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.records.profile import Combination
from pipeline.report.findings import PARTS_MESSAGES, AnalysisData, Finding, Label, Listing

# train_against_inference's messages for a traced pass that ran like the timed steps (its parts may explain).
TRACED_AGREES = frozenset(
    {"finding_train_update_explains", "finding_train_more_than_flops", "finding_train_above_flops_agree"}
)


def conclusion(data: AnalysisData, found: Sequence[Finding]) -> list[Finding]:
    """The opening sentences, each a Finding of kind "conclusion" (rendered like the others), in reading order."""
    return [*_scaling(data), *_fixed_costs(found), *_train_gap(found), *_roof(found)]


def _scaling(data: AnalysisData) -> list[Finding]:
    said = []
    for device in data.devices():
        spans: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for mode in ("train", "inference"):
            batches = data.batches(device, mode)
            if len(batches) < 2:
                continue
            small, large = batches[0], batches[-1]
            paired = data.paired(Combination(large, device, mode), Combination(small, device, mode))
            if paired is None:
                continue
            message = (
                "conclusion_scaling_falls"
                if paired.high < 1
                else "conclusion_scaling_rises"
                if paired.low > 1
                else "conclusion_scaling_undecided"
            )
            spans.setdefault((small, large), []).append(
                {"_message": message, "mode": Label(f"mode_{mode}"), "pct": 100 * paired.value}
            )
        for (small, large), items in spans.items():
            values = {"device": Label(f"device_{device}"), "small": small, "large": large}
            listing = Listing("conclusion_scaling_falls", tuple(items), separator="conclusion_separator")
            said.append(Finding("conclusion", "conclusion_scaling", {**values, "items": listing}, reason=False))
    return said


def _fixed_costs(found: Sequence[Finding]) -> list[Finding]:
    """One reason, the strongest: the per-step parts that fill most of their smallest batch's step."""
    # The update timed without a profiler, where it is per step: the same figure the fixed-cost paragraph gives
    # (one number per claim), before the traced groups.
    timed = [f for f in found if f.message == "finding_update_per_step"]
    if timed:
        keys = ("device", "small", "large", "small_ms", "large_ms")
        return [Finding("conclusion", "conclusion_fixed_update", {key: timed[0].values[key] for key in keys})]
    candidates = [f for f in found if f.message == "finding_fixed_per_step"]
    strongest = max(candidates, key=lambda f: sum(item["share"] for item in f.values["groups"].items), default=None)
    said = []
    for fixed in [strongest] if strongest is not None else []:
        values = fixed.values
        subject = (values["device"], values["mode"], values["small"], values["large"])
        growing = next(
            (
                f
                for f in found
                if f.message == "finding_grows_with_batch"
                and (f.values["device"], f.values["mode"], f.values["small"], f.values["large"]) == subject
            ),
            None,
        )
        groups = Listing(
            "conclusion_fixed_item",
            tuple(
                {"group": item["group"], "share": item["share"], "small": values["small"]}
                for item in values["groups"].items
            ),
            separator="conclusion_separator",
        )
        common = {"device": values["device"], "mode": values["mode"], "small": values["small"], "groups": groups}
        if growing is None:
            said.append(Finding("conclusion", "conclusion_fixed", common))
            continue
        grows = Listing(
            "conclusion_group_item",
            tuple({"group": item["group"]} for item in growing.values["groups"].items),
            separator="conclusion_separator",
        )
        said.append(Finding("conclusion", "conclusion_fixed_and_growing", {**common, "growing": grows}))
    return said


def _train_gap(found: Sequence[Finding]) -> list[Finding]:
    said = []
    by_device: dict[str, list[Finding]] = {}
    for each in (f for f in found if f.kind == "train_against_inference"):
        by_device.setdefault(each.values["device"].key, []).append(each)
    for findings in by_device.values():
        ordered = sorted(findings, key=lambda f: f.values["batch"])
        small, large = ordered[0], ordered[-1]
        values: dict[str, Any] = {
            "device": small.values["device"],
            "small": small.values["batch"],
            "large": large.values["batch"],
            "small_ratio": small.values["ratio"],
            "large_ratio": large.values["ratio"],
        }
        if small is large:
            message = "conclusion_train_one"
        elif small.values["low"] > large.values["high"]:
            message = "conclusion_train_shrinks"
        else:
            message = "conclusion_train_range"
        said.append(Finding("conclusion", message, values))
        if small.message in PARTS_MESSAGES:
            factor, without = small.cites["update_factor"], small.cites["without_update_untraced"]
            if factor.low > 1:  # the update's share is above 0 in its whole interval
                share = small.cites["update_share"].value
                parts = {"batch": small.values["batch"], "share": share, "without": without.value}
                said.append(Finding("conclusion", "conclusion_train_update_parts", parts))
            continue
        if small.message not in TRACED_AGREES:
            continue
        without, traced = small.cites["without_update"], small.cites["traced_ratio"]
        if without.high < traced.low:
            said.append(
                Finding(
                    "conclusion",
                    "conclusion_train_update",
                    {"batch": small.values["batch"], "traced": traced.value, "without": without.value},
                )
            )
    return said


def _roof(found: Sequence[Finding]) -> list[Finding]:
    closer = [f for f in found if f.message == "finding_closer_to_roof"]
    if not closer:
        return []
    best = max(closer, key=lambda f: f.values["pct_large"] - f.values["pct_small"])
    keys = ("device", "mode", "group", "small", "large", "pct_small", "pct_large")
    return [Finding("conclusion", "conclusion_roof", {key: best.values[key] for key in keys})]
