"""The hand-in's 实验结果分析 / "Analysis of the results", laid out as a student writes one: the conclusion, one
short paragraph per mechanism the data licenses, one paragraph mapping the top operators to their layers, then one
evidence table (every number with its 95 % interval, where it comes from, the rule that licenses it) and a summary.
The full-precision findings stay in the report's "Analysis" (lab_report.analysis_markdown); the conditions the
numbers hold under are said once, under section 2's tables (pipeline.report.handin.conditions_note).

Each paragraph is built from the findings (pipeline.report.findings) and the report's facts (the timed FLOP rates,
the roofline's points, the parameter table, the traced layers), and is left out where none of them licenses it;
docs/analysis.md gives each paragraph's rule. The paragraphs round their numbers for reading; the intervals are in
the evidence table only. Torch-free.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.profiling.trace_analysis import layer_group
from pipeline.records.profile import Combination
from pipeline.records.quantities import rounded_down
from pipeline.report.catalogue import Catalogue
from pipeline.report.findings import (
    FIXED_EXPONENT,
    PARTS_MESSAGES,
    PROPORTIONAL_EXPONENT,
    Finding,
    Label,
    Listing,
)
from pipeline.report.lab_report import ReportInputs
from pipeline.report.operator_layers import NO_GROUP, layer_shares, operators_by_group
from pipeline.report.roofline import WHOLE_STEP, RooflinePoint, roofline_points
from pipeline.report.step_analysis import step_facts

GROUP_ORDER = ("convolution", "linear", "pool_activation_dropout", "loss", "optimizer")
MATERIAL_PEAK_SHARE = 0.01  # a memory part under 1 % of the larger peak is left to the full report
LISTED_SHARE_PCT = 3.0  # an operator is named in the layer mapping where it takes this much of some table
SAVING_GROUPS = ("optimizer", "outside")  # a per-sample saving led by one of these is a fixed cost shared out


@dataclass(frozen=True)
class Evidence:
    """One row of the evidence table: the numbers behind a paragraph, their source and the rule that licenses them."""

    numbers: str
    source: str
    rule: str


@dataclass(frozen=True)
class Paragraph:
    title: str
    sentences: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    summary: str  # the paragraph's claim in one line, for the summary


def handin_analysis(
    found: Sequence[Finding], inputs: ReportInputs, catalogue: Catalogue, groups: Mapping[str, Mapping[str, str]]
) -> str:
    """The section's markdown (without its heading)."""
    say = _Words(catalogue)
    blocks = []
    opening = [each.render(catalogue) for each in found if each.kind == "conclusion"]
    if opening:
        blocks.append(catalogue("conclusion_lead") + catalogue("sentence_joiner").join(opening))
    builders: tuple[Callable[[], Paragraph | None], ...] = (
        lambda: _fixed_costs(found, inputs, say),
        lambda: _closer_to_roof(found, inputs, say),
        lambda: _growing_work(found, inputs, say),
        lambda: _memory(found, say),
        lambda: _train_against_inference(found, inputs, say),
        lambda: _training_speed(found, say),
        lambda: _operator_layers(inputs, groups, say),
    )
    paragraphs = [paragraph for build in builders if (paragraph := build()) is not None]
    blocks += [say("handin_paragraph", title=p.title, text=say.sentences(p.sentences)) for p in paragraphs]
    evidence = _evidence_rows(found, inputs, say) + [(p.title, row) for p in paragraphs for row in p.evidence]
    if evidence:
        blocks.append(f"#### {catalogue('handin_evidence_heading')}\n\n{_evidence_table(evidence, say)}")
    summary = [p.summary for p in paragraphs if p.summary]
    if summary:
        blocks.append(
            f"#### {catalogue('handin_summary_heading')}\n\n"
            + "".join(f"- {line[:1].upper()}{line[1:]}\n" for line in summary)  # a clause may open a line
        )
    blocks.append(catalogue("full_report_line"))
    return spaced("\n\n".join(block.rstrip("\n") for block in blocks) + "\n")


# Chinese typography (docs/analysis.md): a space between a Chinese character and a Latin letter, a digit or a code
# span. The catalogue's own words have it; this puts it where a placeholder's words meet the message's ("来自{group}"
# filled with "Adadelta 优化器更新"). Text without Chinese characters is left as it is.
_CHINESE_THEN_LATIN = re.compile(r"([\u4e00-\u9fff])([A-Za-z0-9`])")
_LATIN_THEN_CHINESE = re.compile(r"([A-Za-z0-9`%])([\u4e00-\u9fff])")


def spaced(text: str) -> str:
    return _LATIN_THEN_CHINESE.sub(r"\1 \2", _CHINESE_THEN_LATIN.sub(r"\1 \2", text))


class _Words:
    """The catalogue, with the few ways the paragraphs put its words together."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue

    def __call__(self, key: str, **values: object) -> str:
        return self.catalogue(key, **{name: self.word(value) for name, value in values.items()})

    def word(self, value: object) -> object:
        """A Label in the language's words; a Listing's items each worded and joined; anything else as it is."""
        if isinstance(value, Label):
            return self.catalogue(value.key)
        if isinstance(value, Listing):
            return self.catalogue(value.separator).join(
                self(entry.get("_message", value.message), **{k: v for k, v in entry.items() if k != "_message"})
                for entry in value.items
            )
        return value

    def joined(self, items: Iterable[str], joiner: str = "list_joiner") -> str:
        return self.catalogue(joiner).join(items)

    def sentences(self, sentences: Iterable[str]) -> str:
        return self.catalogue("sentence_joiner").join(sentences)

    def group(self, group: str) -> str:
        return self.catalogue("handin_no_group") if group == NO_GROUP else self.catalogue(f"group_{group}")

    def combination(self, device: str, mode: str) -> str:
        return self.catalogue(
            "fig_column", device=self.catalogue(f"device_{device}"), mode=self.catalogue(f"mode_{mode}")
        )

    def interval(self, key: str, value: float, low: float, high: float) -> str:
        return self(key, value=value, low=low, high=high)


def _ranged(say: _Words, key: str, values: Mapping[str, Any], value: str, low: str, high: str) -> str:
    """A finding's value with its interval, by the names it keeps them under."""
    return say.interval(key, values[value], values[low], values[high])


def _of(found: Sequence[Finding], *messages: str) -> list[Finding]:
    return [each for each in found if each.message in messages]


def _subject(finding: Finding) -> tuple[str, str, int, int]:
    values = finding.values
    return (
        values["device"].key.removeprefix("device_"),
        values["mode"].key.removeprefix("mode_"),
        values["small"],
        values["large"],
    )


def _traced_source(inputs: ReportInputs, say: _Words) -> str:
    steps = inputs.profiles[0].settings.active_steps if inputs.profiles else 0
    return say("handin_source_traced", steps=steps)


def _paired_source(inputs: ReportInputs, say: _Words) -> str:
    processes = max((found.processes for found in inputs.comparisons), default=0)
    return say("handin_source_paired", processes=processes)


# --- the conclusion's evidence ------------------------------------------------------------------------------------


def _evidence_rows(found: Sequence[Finding], inputs: ReportInputs, say: _Words) -> list[tuple[str, Evidence]]:
    """The conclusion's numbers: the paired ratios its sentences round (smallest to largest batch per sample;
    training over inference at both ends)."""
    said = {each.message for each in found if each.kind == "conclusion"}
    rows: list[tuple[str, Evidence]] = []
    title = say("handin_conclusion_title")
    source = _paired_source(inputs, say)
    for comparisons in inputs.comparisons:
        device = comparisons.device
        scaling, modes = [], []
        for mode in ("train", "inference"):
            batches = sorted(
                {
                    r.combination.batch_size
                    for r in inputs.profiles
                    if (r.combination.device, r.combination.mode) == (device, mode)
                }
            )
            if len(batches) < 2:
                continue
            paired = comparisons.by_pair.get(
                (Combination(batches[-1], device, mode).name, Combination(batches[0], device, mode).name)
            )
            if paired is not None:
                scaling.append(
                    say(
                        "handin_evidence_scaling",
                        combination=say.combination(device, mode),
                        small=batches[0],
                        large=batches[-1],
                        ratio=say.interval("handin_ratio_ci", paired.value, paired.low, paired.high),
                    )
                )
        batches = sorted({r.combination.batch_size for r in inputs.profiles if r.combination.device == device})
        for batch in dict.fromkeys((batches[0], batches[-1]) if batches else ()):
            paired = comparisons.by_pair.get((f"{batch}-{device}-train", f"{batch}-{device}-inference"))
            if paired is not None:
                modes.append(
                    say(
                        "handin_evidence_modes",
                        device=say.catalogue(f"device_{device}"),
                        batch=batch,
                        ratio=say.interval("handin_times_ci", paired.value, paired.low, paired.high),
                    )
                )
        if scaling and said & {"conclusion_scaling"}:
            rows.append((title, Evidence(say.joined(scaling, "list_separator"), source, say("handin_rule_direction"))))
        if modes and said & {"conclusion_train_shrinks", "conclusion_train_range", "conclusion_train_one"}:
            rows.append((title, Evidence(say.joined(modes, "list_separator"), source, say("handin_rule_gap"))))
    return rows


# --- fixed costs per step -----------------------------------------------------------------------------------------


def _fixed_costs(found: Sequence[Finding], inputs: ReportInputs, say: _Words) -> Paragraph | None:
    """Said where the traced steps class a part as paid per step (`finding_fixed_per_step`), or a per-sample saving
    is led by the update or the time outside operators (`why_per_sample_changes`)."""
    sentences, evidence = [], []
    fixed = _of(found, "finding_fixed_per_step")
    savings = [
        each
        for each in found
        if each.kind == "why_per_sample_changes"
        and each.values["groups"].items
        and each.values["groups"].items[0]["group"].key.removeprefix("group_") in SAVING_GROUPS
        and each.message.startswith("finding_change_attributed_saved")
    ]
    update = _of(found, "finding_update_per_step")
    if not fixed and not savings and not update:
        return None
    named = {item["group"].key for each in fixed for item in each.values["groups"].items}
    named |= {each.values["groups"].items[0]["group"].key for each in savings}
    named |= {"group_optimizer" for _ in update}
    parameters = _largest_layer(inputs)
    if "group_optimizer" in named and parameters is not None:
        sentences.append(say("handin_fixed_update", **parameters))
        evidence.append(
            Evidence(
                say("handin_evidence_parameters", **parameters),
                say("handin_source_parameters"),
                say("handin_rule_count"),
            )
        )
    for each in update:
        values = each.values
        sentences.append(say("handin_fixed_update_timed", **values))
        if isinstance(values["traffic"], Listing):  # its counted bytes at the measured bandwidth, beside the saving
            sentences.append(str(say.word(values["traffic"])).strip())
        evidence.append(
            Evidence(
                say(
                    "handin_evidence_update_timed",
                    device=values["device"],
                    small=values["small"],
                    large=values["large"],
                    small_ms=_ranged(say, "handin_ms_ci", values, "small_ms", "small_low", "small_high"),
                    large_ms=_ranged(say, "handin_ms_ci", values, "large_ms", "large_low", "large_high"),
                    growth=_ranged(say, "handin_times_ci", values, "growth", "growth_low", "growth_high"),
                ),
                say("handin_source_update_timed", paired=_paired_source(inputs, say)),
                say(
                    "handin_rule_fixed",
                    scale=values["scale"],
                    bound=values["bound"],
                    exponent=FIXED_EXPONENT,
                    fall=rounded_down(values["scale"] / values["bound"], 0),
                ),
            )
        )
    for each in fixed:
        device, mode, small, large = _subject(each)
        # Where the update was timed without a profiler, that figure is the update's (one number per claim).
        kept = [item for item in each.values["groups"].items if not (update and item["group"].key == "group_optimizer")]
        if not kept:
            continue
        items = [
            say(
                "handin_fixed_item",
                group=item["group"],
                value=item["value"],
                share=item["share"],
                small=small,
                large=large,
                fall=each.values["scale"] / item["value"],
            )
            for item in kept
        ]
        sentences.append(
            say(
                "handin_fixed_per_step",
                combination=say.combination(device, mode),
                small=small,
                large=large,
                groups=say.joined(items),
            )
        )
        numbers = [
            say(
                "handin_evidence_growth",
                group=item["group"],
                growth=say.interval("handin_times_ci", item["value"], item["low"], item["high"]),
            )
            for item in kept
        ]
        scale = each.values["scale"]
        evidence.append(
            Evidence(
                say("handin_evidence_pair", combination=say.combination(device, mode), small=small, large=large)
                + say.joined(numbers, "list_separator"),
                _traced_source(inputs, say),
                say(
                    "handin_rule_fixed",
                    scale=scale,
                    bound=each.values["bound"],
                    exponent=FIXED_EXPONENT,
                    fall=each.values["fall"],
                ),
            )
        )
    for each in savings:
        device, mode, small, large = _subject(each)
        first = each.values["groups"].items[0]
        if update and first["group"].key == "group_optimizer":  # the untraced saving says the update's part
            continue
        sentences.append(
            say(
                "handin_fixed_saving",
                combination=say.combination(device, mode),
                small=small,
                large=large,
                group=first["group"],
                share=first["value"],
            )
        )
        evidence.append(_saving_evidence(each, inputs, say))
    named_groups = say.joined(say.catalogue(key) for key in dict.fromkeys(sorted(named, key=_group_order)))
    summary = say("handin_fixed_summary", groups=named_groups)
    return Paragraph(say("handin_fixed_title"), tuple(sentences), tuple(evidence), summary)


def _group_order(key: str) -> int:
    group = key.removeprefix("group_")
    order = ("optimizer", "outside", *GROUP_ORDER)
    return order.index(group) if group in order else len(order)


def _saving_evidence(each: Finding, inputs: ReportInputs, say: _Words) -> Evidence:
    device, mode, small, large = _subject(each)
    values = each.values
    shares = [_share_item(item, say) for item in values["groups"].items]
    against = values.get("against")
    if isinstance(against, Listing) and against.items:
        shares.append(
            say("handin_evidence_against", shares=say.joined(_share_item(item, say) for item in against.items))
        )
    numbers = say(
        "handin_evidence_saving",
        combination=say.combination(device, mode),
        small=small,
        large=large,
        traced=say.interval("handin_ratio_ci", values["traced_ratio"], values["traced_low"], values["traced_high"]),
        one_more=_one_more(values, "handin_ratio_range", say),
        shares=say.joined(shares, "list_separator"),
    )
    return Evidence(numbers, _traced_source(inputs, say), say("handin_rule_why"))


def _share_item(item: Mapping[str, Any], say: _Words) -> str:
    """A group's share of a whole change with its interval; a share whose interval runs past 100 % as the finding
    words it (at least its lower end, or more than the whole change)."""
    if "_message" in item or "high" not in item:
        return say(item.get("_message", "finding_share_item"), **{k: v for k, v in item.items() if k != "_message"})
    return say(
        "handin_evidence_share", group=item["group"], share=_share_ci(item["value"], item["low"], item["high"], say)
    )


def _one_more(values: Mapping[str, Any], key: str, say: _Words) -> str:
    """Where the traced ratio was held: where one more timing process would fall (the findings' `one_more_low` and
    `one_more_high`), or the paired interval in findings that give only that."""
    low = values.get("one_more_low", values.get("paired_low", values.get("low")))
    high = values.get("one_more_high", values.get("paired_high", values.get("high")))
    return say(key, low=low, high=high)


def _share_ci(value: float, low: float, high: float, say: _Words) -> str:
    """A share with its interval; the share alone where the interval reaches past 0 or 100 % (a bound a share
    cannot pass says nothing)."""
    if low < 0 or high > 100:
        return say("handin_pct_alone", value=value)
    return say.interval("handin_pct_ci", value, low, high)


def _largest_layer(inputs: ReportInputs) -> dict[str, Any] | None:
    """The model's parameters and the layer holding most of them (graph/summary.json), in the words' placeholders."""
    layers = inputs.model_layers or []
    total = sum(int(layer.get("parameters", 0)) for layer in layers)
    if total <= 0:
        return None
    largest = max(layers, key=lambda layer: int(layer.get("parameters", 0)))
    held = int(largest["parameters"])
    return {
        "parameters": f"{total:,}",
        "layer": str(largest["layer"]).rsplit(".", 1)[-1],
        "layer_parameters": f"{held:,}",
        "share": 100 * held / total,
    }


# --- closer to the roof -------------------------------------------------------------------------------------------


def _closer_to_roof(found: Sequence[Finding], inputs: ReportInputs, say: _Words) -> Paragraph | None:
    """Said where a whole step's timed FLOP rate rose between the smallest and largest batch (intervals apart), the
    fully connected layers' counted intensity left of the ridge at batch 1, or a traced finding says a group ran
    closer to the roof (`finding_closer_to_roof`) or a per-sample saving is led by the convolutions or the fully
    connected layers."""
    sentences, evidence = [], []
    rates, rate_numbers = [], []
    facts = [fact for fact in step_facts(inputs.profiles) if fact.rate is not None and fact.rate.peak_gflops_per_s > 0]
    for (device, mode), group in itertools.groupby(
        sorted(facts, key=lambda f: (f.device, f.mode, f.batch_size)), key=lambda f: (f.device, f.mode)
    ):
        ordered = list(group)
        first, last = ordered[0], ordered[-1]
        low_rate, high_rate = first.achieved_gflops_per_s, last.achieved_gflops_per_s
        if first is last or low_rate is None or high_rate is None or not high_rate.low > low_rate.high:
            continue
        peak = first.rate.peak_gflops_per_s  # type: ignore[union-attr]
        rates.append(
            say(
                "handin_rate_item",
                combination=say.combination(device, mode),
                small_rate=low_rate.value,
                large_rate=high_rate.value,
                small_pct=100 * low_rate.value / peak,
                large_pct=100 * high_rate.value / peak,
            )
        )
        rate_numbers.append(
            say(
                "handin_evidence_rate",
                combination=say.combination(device, mode),
                small=first.batch_size,
                large=last.batch_size,
                small_rate=say.interval("handin_rate_ci", low_rate.value, low_rate.low, low_rate.high),
                large_rate=say.interval("handin_rate_ci", high_rate.value, high_rate.low, high_rate.high),
                peak=peak,
            )
        )
    if rates:
        small = min(fact.batch_size for fact in facts)
        large = max(fact.batch_size for fact in facts)
        sentences.append(say("handin_rate", small=small, large=large, items=say.joined(rates)))
        evidence.append(
            Evidence(say.joined(rate_numbers, "list_separator"), say("handin_source_rate"), say("handin_rule_rate"))
        )
    points = [point for point in roofline_points(inputs.profiles)]
    for device in dict.fromkeys(point.device for point in points):
        on_device = [point for point in points if point.device == device]
        crossing = _matrix_vector(on_device, say)
        if crossing is not None:
            sentences.append(crossing[0])
            evidence.append(crossing[1])
        bound = _compute_bound(on_device, say)
        if bound is not None and sentences:
            sentences.append(bound)
    for each in _of(found, "finding_closer_to_roof"):
        device, mode, small, large = _subject(each)
        values = each.values
        sentences.append(
            say(
                "handin_closer",
                combination=say.combination(device, mode),
                group=values["group"],
                small=small,
                large=large,
                pct_small=values["pct_small"],
                pct_large=values["pct_large"],
            )
        )
        evidence.append(
            Evidence(
                say(
                    "handin_evidence_closer",
                    combination=say.combination(device, mode),
                    group=values["group"],
                    small=small,
                    large=large,
                    small_rate=say.interval(
                        "handin_rate_ci", values["rate_small"], values["rate_small_low"], values["rate_small_high"]
                    ),
                    large_rate=say.interval(
                        "handin_rate_ci", values["rate_large"], values["rate_large_low"], values["rate_large_high"]
                    ),
                ),
                _traced_source(inputs, say),
                say("handin_rule_closer"),
            )
        )
    if not sentences:
        return None
    summary = say("handin_roof_summary") if rates else ""
    return Paragraph(say("handin_roof_title"), tuple(sentences), tuple(evidence), summary)


def _linear_points(points: Sequence[RooflinePoint], batch: int) -> list[RooflinePoint]:
    """The fully connected layers' forward product (`aten::addmm`) at `batch`: the one that multiplies the weights by
    the batch (the backward's `aten::mm` holds the weight gradient, an outer product at batch 1)."""
    return [point for point in points if point.batch_size == batch and point.name == "aten::addmm"]


def _matrix_vector(points: Sequence[RooflinePoint], say: _Words) -> tuple[str, Evidence] | None:
    """At batch 1 a fully connected layer multiplies its weight matrix by one vector: said where its operators' counted
    intensity lies left of the ridge there, with where it lies at the largest batch; and where one ran above the memory
    roof (its traced rate, from a pass that ran like the timed steps), that its bytes did not all come from DRAM."""
    batches = sorted({point.batch_size for point in points})
    if not batches or batches[0] != 1 or len(batches) < 2:
        return None
    vector, matrix = _linear_points(points, 1), _linear_points(points, batches[-1])
    if not vector or not matrix:
        return None
    ridge = vector[0].ridge
    small = max(point.intensity for point in vector)
    large = min(point.intensity for point in matrix)
    if small >= ridge:
        return None
    side = "handin_right_of_ridge" if large >= ridge else "handin_left_of_ridge"
    values = {"small_intensity": small, "large_intensity": large, "ridge": ridge, "large": batches[-1]}
    sentence = say("handin_matrix_vector", side=say(side), **values)
    above = [
        point
        for point in vector
        if point.traced_like_timed and point.achieved.value > point.bandwidth_gb_per_s * point.intensity
    ]
    if above:  # over the memory roof: its bytes did not all come from DRAM at the triad's bandwidth
        fastest = max(above, key=lambda point: point.roof_pct)
        sentence += say(
            "handin_above_memory_roof",
            combination=say.combination(fastest.device, fastest.mode),
            achieved=fastest.achieved.value,
            pct=fastest.roof_pct,
        )
    operators = sorted({point.name for point in (*vector, *matrix)})
    numbers = say(
        "handin_evidence_intensity",
        operators=say.joined(f"`{name}`" for name in operators),
        ridge=ridge,
        peak=vector[0].peak_gflops_per_s,
        bandwidth=vector[0].bandwidth_gb_per_s,
        **{key: value for key, value in values.items() if key != "ridge"},
    )
    return sentence, Evidence(numbers, say("handin_source_roofs"), say("handin_rule_ridge"))


def _compute_bound(points: Sequence[RooflinePoint], say: _Words) -> str | None:
    """The convolutions' operators that are compute-bound at every batch size they ran at (roofline's rule)."""
    convolutions = [point for point in points if point.name != WHOLE_STEP and layer_group(point.name) == "convolution"]
    names = sorted({point.name for point in convolutions})
    bound = [name for name in names if all(p.bound == "compute-bound" for p in convolutions if p.name == name)]
    if not bound:
        return None
    placed = [point for point in convolutions if point.name in bound]
    low, high = (f"{value:.0f}" for value in (min(p.intensity for p in placed), max(p.intensity for p in placed)))
    said = say(
        "handin_compute_bound",
        operators=say.joined(f"`{name}`" for name in bound),
        span=low if low == high else f"{low}–{high}",
    )
    # A convolution kernel that ran left of the ridge (at batch 1 the CPU can take the direct `_slow_conv2d_forward`
    # path for a layer): said with where it ran, so that "every convolution is right of the ridge" is not implied.
    for point in sorted(
        (p for p in convolutions if p.name not in bound and p.intensity < p.ridge), key=lambda p: (p.name, p.batch_size)
    ):
        said += say(
            "handin_conv_left",
            operator=point.name,
            combination=say.combination(point.device, point.mode),
            batch=point.batch_size,
            intensity=point.intensity,
        )
    return said


# --- work that grows with the samples ----------------------------------------------------------------------------


def _growing_work(found: Sequence[Finding], inputs: ReportInputs, say: _Words) -> Paragraph | None:
    """Said where the traced steps class a part as growing with the batch (`finding_grows_with_batch`)."""
    growing = _of(found, "finding_grows_with_batch")
    if not growing:
        return None
    sentences, evidence = [], []
    dearer: list[str] = []  # groups whose time per step grew beyond the samples: dearer per sample
    for each in growing:
        device, mode, small, large = _subject(each)
        items = each.values["groups"].items
        scale = large / small

        def item_words(item: Mapping[str, Any], scale: float = scale) -> str:
            key = "handin_growth_item_dearer" if item["low"] > scale else "handin_growth_item"
            return say(key, group=item["group"], value=item["value"], scale=scale)

        dearer += [
            say("handin_dearer_in", combination=say.combination(device, mode), group=item["group"])
            for item in items
            if item["low"] > scale
        ]
        sentences.append(
            say(
                "handin_grows",
                combination=say.combination(device, mode),
                small=small,
                large=large,
                groups=say.joined(item_words(item) for item in items),
                pct=each.values["pct"],
            )
        )
        numbers = [
            say(
                "handin_evidence_growth",
                group=item["group"],
                growth=say.interval("handin_times_ci", item["value"], item["low"], item["high"]),
            )
            for item in items
        ]
        evidence.append(
            Evidence(
                say("handin_evidence_pair", combination=say.combination(device, mode), small=small, large=large)
                + say.joined(numbers, "list_separator"),
                _traced_source(inputs, say),
                say(
                    "handin_rule_grows",
                    scale=each.values["scale"],
                    bound=each.values["bound"],
                    exponent=PROPORTIONAL_EXPONENT,
                ),
            )
        )
    for each in _of(found, "finding_what_sets_the_cost"):
        device, mode, small, large = _subject(each)
        values = each.values
        sentences.append(
            say(
                "handin_sets_the_cost",
                combination=say.combination(device, mode),
                small=small,
                large=large,
                fixed_share=values["fixed_share"],
                growing_share=values["growing_share"],
            )
        )
        evidence.append(
            Evidence(
                say(
                    "handin_evidence_sets_the_cost",
                    combination=say.combination(device, mode),
                    small=small,
                    large=large,
                    fixed=_share_ci(values["fixed_share"], values["fixed_low"], values["fixed_high"], say),
                    growing=_share_ci(values["growing_share"], values["growing_low"], values["growing_high"], say),
                ),
                _traced_source(inputs, say),
                say("handin_rule_sets_the_cost"),
            )
        )
    flops = _convolution_flops(inputs)
    if flops is not None:
        sentences.append(say("handin_grows_flops", **flops))
    summary = (
        say("handin_grows_summary_dearer", groups=say.joined(dict.fromkeys(dearer)))
        if dearer
        else say("handin_grows_summary")
    )
    return Paragraph(say("handin_grows_title"), tuple(sentences), tuple(evidence), summary)


def _convolution_flops(inputs: ReportInputs) -> dict[str, float] | None:
    """Forward MFLOPs per sample and the convolutions' share of them (graph/summary.json)."""
    layers = inputs.model_layers or []
    total = sum(float(layer.get("flops_per_sample", 0)) for layer in layers)
    convolutions = sum(float(layer.get("flops_per_sample", 0)) for layer in layers if layer.get("kind") == "Conv2d")
    if total <= 0 or convolutions <= 0:
        return None
    return {"mflops": total / 1e6, "pct": 100 * convolutions / total}


# --- memory -------------------------------------------------------------------------------------------------------


def _memory(found: Sequence[Finding], say: _Words) -> Paragraph | None:
    """Said where `memory_by_batch` found a part that grew or sits at one peak only; an empty list is left out."""
    said = _of(found, "finding_memory")
    if not said:
        return None
    sentences = []
    numbers = []
    for each in said:
        device, mode, small, large = _subject(each)
        values = _material_parts(each.values)
        clauses = []
        if isinstance(values["grows"], Listing):
            clauses.append(say("handin_memory_grows", parts=_changes(values["grows"], say)))
        if isinstance(values["stays"], Listing):
            stays = say.joined(
                say("handin_memory_part", part=item["part"], mb=item["mb"]) for item in values["stays"].items
            )
            clauses.append(say("handin_memory_stays", parts=stays))
        if isinstance(values["moved"], Listing):
            at_small = [item for item in values["moved"].items if item["old"] > 0]
            at_large = [item for item in values["moved"].items if item["new"] > 0]
            peaks = [
                say(
                    "handin_memory_at_peak",
                    batch=batch,
                    parts=say.joined(say("handin_memory_part", part=item["part"], mb=item[key]) for item in items),
                )
                for batch, items, key in ((small, at_small, "old"), (large, at_large, "new"))
                if items
            ]
            clauses.append(say("handin_memory_moved", peaks=say.joined(peaks, "conclusion_separator")))
        sentences.append(
            say(
                "handin_memory",
                combination=say.combination(device, mode),
                small=small,
                large=large,
                peak_small=values["peak_small"],
                peak_large=values["peak_large"],
                clauses=say.joined(clauses, "list_separator"),
            )
        )
        numbers.append(
            say(
                "handin_evidence_memory",
                combination=say.combination(device, mode),
                small=small,
                large=large,
                peak_small=values["peak_small"],
                peak_large=values["peak_large"],
            )
        )
    evidence = Evidence(
        say.joined(numbers, "list_separator"), say("handin_source_allocator"), say("handin_rule_memory")
    )
    return Paragraph(say("handin_memory_title"), tuple(sentences), (evidence,), _memory_summary(said, say))


def _material_parts(values: Mapping[str, Any]) -> dict[str, Any]:
    """The memory finding's part lists, less the parts under MATERIAL_PEAK_SHARE of the larger peak (the full report
    names them all); a list left empty is no Listing."""
    floor = MATERIAL_PEAK_SHARE * max(values["peak_small"], values["peak_large"])
    kept: dict[str, Any] = dict(values)
    for key in ("grows", "stays", "shrinks", "moved"):
        listing = values[key]
        if not isinstance(listing, Listing):
            continue
        items = tuple(
            item for item in listing.items if max(item.get("mb", 0), item.get("old", 0), item.get("new", 0)) >= floor
        )
        kept[key] = dataclasses.replace(listing, items=items) if items else None
    return kept


def _changes(listing: Listing, say: _Words) -> str:
    return say.joined(
        say("handin_memory_change", part=item["part"], old=item["old"], new=item["new"]) for item in listing.items
    )


def _memory_summary(said: Sequence[Finding], say: _Words) -> str:
    """Per combination, the parts that grew with the batch, or that its two peaks fall at different moments of the
    step (then no part can be said to grow); then the parts that stayed the same wherever they were held."""
    clauses, stays = [], []
    for each in said:
        device, mode, _, _ = _subject(each)
        values = _material_parts(each.values)
        if isinstance(values["grows"], Listing):
            grows = say.joined(say.catalogue(item["part"].key) for item in values["grows"].items)
            clauses.append(say("handin_memory_summary_mode", combination=say.combination(device, mode), grows=grows))
        elif isinstance(values["moved"], Listing):
            clauses.append(say("handin_memory_summary_moved", combination=say.combination(device, mode)))
        if isinstance(values["stays"], Listing):
            stays += [item["part"].key for item in values["stays"].items]
    if not clauses:
        return ""
    if stays:
        parts = say.joined(say.catalogue(part) for part in dict.fromkeys(stays))
        clauses.append(say("handin_memory_summary_stays", stays=parts))
    return say("handin_memory_summary", clauses=say.joined(clauses, "list_separator"))


# --- training against inference -----------------------------------------------------------------------------------

# train_against_inference's messages whose traced pass ran like the timed steps, and what each says of the update.
UPDATE_WORDS = {
    "finding_train_update_explains": "handin_modes_update_explains",
    "finding_train_more_than_flops": "handin_modes_more_than_update",
    "finding_train_above_flops_agree": "handin_modes_update_part",
}


# excess_without_update's messages the hand-in says, and its words for each (none where the excess grows with the
# batch: then it only looks smaller against the inference step).
EXCESS_WORDS = {
    "finding_excess_without_update_per_step": "handin_modes_excess_shrinks",
    "finding_excess_without_update_between": "handin_modes_excess_between",
}

# train_against_inference's messages whose paired ratio does not lie wholly above the FLOP count's.
UNDER_FLOPS = {"finding_train_against_flops", "finding_train_flops_timed", "finding_train_parts_against_flops"}

# train_against_inference's messages decided from the training step's parts (timed untraced beside it), and the
# verdict each gives, grouped by batch size (none where the ratio is not above the FLOPs' prediction; the update's
# part of the excess is said per batch, `handin_modes_parts_explains`).
PARTS_VERDICTS = {
    "finding_train_parts_undecided_without": "handin_modes_parts_undecided_without",
}


def _train_against_inference(found: Sequence[Finding], inputs: ReportInputs, say: _Words) -> Paragraph | None:
    """Said where `train_against_inference` compared the two modes at some batch size: the FLOP count's ratio, the
    timed ratios; where the record holds the training step's parts (timed untraced beside it), the update's share and
    the ratio without it, and what they decide against the FLOPs' prediction; else the update's part where the
    traced pass ran like the timed steps, and where it did not, what would decide it."""
    said = [each for each in found if each.kind == "train_against_inference"]
    if not said:
        return None
    sentences, evidence = [], []
    for device, group in itertools.groupby(said, key=lambda f: f.values["device"].key):
        findings = list(group)
        flop_ratio = findings[0].values["flop_ratio"]
        ratios = say.joined(
            say("handin_modes_ratio", ratio=each.values["ratio"], batch=each.values["batch"]) for each in findings
        )
        above = [each for each in findings if each.message not in UNDER_FLOPS]
        key = (
            "handin_modes_all_above"
            if len(above) == len(findings)
            else "handin_modes_some_above"
            if above
            else "handin_modes_none_above"
        )
        sentences.append(
            say(
                key,
                device=Label(device),
                flop_ratio=flop_ratio,
                ratios=ratios,
                batches=say.joined(str(each.values["batch"]) for each in above),
            )
        )
        sentences += _parts_sentences([each for each in findings if each.message in PARTS_MESSAGES], say)
        for each in findings:
            words = UPDATE_WORDS.get(each.message)
            if words is None:
                continue
            values = each.values
            update = next(
                (item["value"] for item in values["phases"].items if item["phase"].key == "phase_optimizer"), 0.0
            )
            sentences.append(
                say(
                    words, batch=values["batch"], traced=values["traced_ratio"], without=values["without"], share=update
                )
            )
        for each in findings:
            if each.message == "finding_train_process_apart":
                values = each.values
                sentences.append(
                    say(
                        "handin_modes_process_apart",
                        batch=values["batch"],
                        traced=values["traced_ratio"],
                        around=values["untraced_ratio"],
                    )
                )
            if each.message == "finding_train_traced_apart":
                values = each.values
                sentences.append(
                    say(
                        "handin_modes_traced_apart",
                        batch=values["batch"],
                        traced=values["traced_ratio"],
                        around=values["untraced_ratio"],
                        train_hooks=values["train_hooks"],
                        inference_hooks=values["inference_hooks"],
                    )
                )
        for each in _of(found, *EXCESS_WORDS):
            if each.values["device"].key == device:
                sentences.append(say(EXCESS_WORDS[each.message], **each.values))
        refused = [each for each in findings if each.message == "finding_train_above_flops"]
        if refused:
            sentences.append(
                say(
                    "handin_modes_undecided",
                    batches=say.joined(str(each.values["batch"]) for each in refused),
                    traced=say.joined(say("handin_times", value=each.values["traced_ratio"]) for each in refused),
                    active_steps=min(
                        each.values.get("active_steps", inputs.profiles[0].settings.active_steps) for each in refused
                    ),
                )
            )
        numbers = [_mode_evidence(each, say) for each in findings]
        parts = [each for each in findings if each.message in PARTS_MESSAGES]
        sources, rules = [], []
        if parts:
            sources.append(say("handin_source_modes_parts", paired=_paired_source(inputs, say)))
            rules.append(say("handin_rule_modes_parts"))
        if len(parts) < len(findings):
            sources.append(
                say("handin_source_modes", paired=_paired_source(inputs, say), traced=_traced_source(inputs, say))
            )
            rules.append(say("handin_rule_modes"))
        evidence.append(
            Evidence(
                say("handin_evidence_modes_flops", device=Label(device), flop_ratio=flop_ratio)
                + say.joined(numbers, "list_separator"),
                say.joined(dict.fromkeys(sources), "list_separator"),
                say.joined(rules, "list_separator"),
            )
        )
    return Paragraph(say("handin_modes_title"), tuple(sentences), tuple(evidence), _modes_summary(said, say))


def _parts_sentences(findings: Sequence[Finding], say: _Words) -> list[str]:
    """What the training step's parts say, one device's: the update's share and the ratio without it at each batch
    size, against the FLOPs' prediction; then each batch's verdict against that prediction, batch sizes with the
    same verdict together (none where the ratio is not above the prediction)."""
    if not findings:
        return []
    shares = say.joined(
        say("handin_modes_parts_share", share=each.values["share"], batch=each.values["batch"]) for each in findings
    )
    withouts = say.joined(
        say("handin_modes_ratio", ratio=each.values["without"], batch=each.values["batch"]) for each in findings
    )
    sentences = [
        say("handin_modes_parts", shares=shares, withouts=withouts, flop_ratio=findings[0].values["flop_ratio"])
    ]
    for each in findings:
        if each.message == "finding_train_parts_update_explains":
            sentences.append(say("handin_modes_parts_explains", batch=each.values["batch"]))
    beyond = [each for each in findings if each.message == "finding_train_parts_more_than_update"]
    if beyond:
        excess = say.joined(
            say("handin_modes_parts_excess_share", share=each.values["excess"], batch=each.values["batch"])
            for each in beyond
        )
        named = say.joined(str(each.values["batch"]) for each in beyond)
        sentences.append(say("handin_modes_parts_beyond", batches=named, shares=excess))
    for message, words in PARTS_VERDICTS.items():
        batches = [str(each.values["batch"]) for each in findings if each.message == message]
        if batches:
            sentences.append(say(words, batches=say.joined(batches)))
    return sentences


def _mode_evidence(each: Finding, say: _Words) -> str:
    """One batch size's numbers in the evidence row: the paired ratio with the parts (untraced), or with the traced
    pass's ratios, or alone where the traced pass was set aside."""
    values = each.values
    if each.message in PARTS_MESSAGES:
        excess = ""
        if "excess_low" in values:  # the update's part of the excess, process by process
            excess = _ranged(say, "handin_evidence_excess", values, "excess", "excess_low", "excess_high")
        return (
            say(
                "handin_evidence_mode_parts",
                batch=values["batch"],
                ratio=values["ratio"],
                low=values["low"],
                high=values["high"],
                factor=say.interval("handin_times_ci", values["factor"], values["factor_low"], values["factor_high"]),
                share=say.interval("handin_pct_ci", values["share"], values["share_low"], values["share_high"]),
                without=say.interval(
                    "handin_times_ci", values["without"], values["without_low"], values["without_high"]
                ),
            )
            + excess
        )
    if "set_aside" in values:
        return say(
            "handin_evidence_mode_timed",
            batch=values["batch"],
            ratio=values["ratio"],
            low=values["low"],
            high=values["high"],
            set_aside=say.joined(say.catalogue(item["name"].key) for item in values["set_aside"].items),
        )
    return say(
        "handin_evidence_mode_item",
        batch=values["batch"],
        ratio=values["ratio"],
        low=values["low"],
        high=values["high"],
        one_more=_one_more(values, "handin_times_range", say),
        traced=say.interval("handin_times_ci", values["traced_ratio"], values["traced_low"], values["traced_high"]),
        without=say.interval("handin_times_ci", values["without"], values["without_low"], values["without_high"]),
    )


def _modes_summary(said: Sequence[Finding], say: _Words) -> str:
    """The summary's line, only where every batch size's ratio lies above the FLOPs' prediction: that, and where every
    finding has the training step's parts, the update's share at each batch size and the verdicts they decide (the
    update is the whole excess; even without it the step costs more than the prediction)."""
    above_all = [each.values["flop_ratio"] for each in said if each.message not in UNDER_FLOPS]
    if len(above_all) != len(said):
        return ""
    if not all(each.message in PARTS_MESSAGES for each in said):
        return say("handin_modes_summary", flop_ratio=min(above_all))
    shares = say.joined(
        say("handin_modes_parts_share", share=each.values["share"], batch=each.values["batch"]) for each in said
    )
    verdicts = []
    for message, words in (
        ("finding_train_parts_update_explains", "handin_modes_summary_explains"),
        ("finding_train_parts_more_than_update", "handin_modes_summary_beyond"),
    ):
        batches = [str(each.values["batch"]) for each in said if each.message == message]
        if batches:
            verdicts.append(say(words, batches=say.joined(batches)))
    separator = say.catalogue("list_separator")
    return say(
        "handin_modes_summary_parts",
        flop_ratio=min(above_all),
        shares=shares,
        verdicts="".join(separator + verdict for verdict in verdicts),
    )


# --- training's speed against the profile's ---------------------------------------------------------------------


def _training_speed(found: Sequence[Finding], say: _Words) -> Paragraph | None:
    """Said where `training_against_profile` compared them: the gap and the settings that differ, unapportioned."""
    said = [each for each in found if each.kind == "training_against_profile"]
    if not said:
        return None
    each = said[0]
    values = each.values
    differences = values["differences"]
    common = {
        "trained": values["trained"],
        "batch": values["batch"],
        "ratio": values["ratio"],
        "device": values["device"],
    }
    if each.message == "finding_training_faster" and differences.items:
        items = [
            say("finding_difference_busy", share=item["share"])
            if item.get("_message") == "finding_difference_busy"
            else say("handin_difference_item", what=item["what"], train=item["train"], profile=item["profile"])
            for item in differences.items
        ]
        sentence = say("handin_speed_differs", differences=say.joined(items), **common)
    else:
        sentence = say("handin_speed_same", **common)
    numbers = say(
        "handin_evidence_speed",
        trained=values["trained"],
        profiled=say.interval(
            "handin_rate_samples_ci", values["profiled"], values["profiled_low"], values["profiled_high"]
        ),
        ratio=say.interval("handin_times_ci", values["ratio"], values["ratio_low"], values["ratio_high"]),
    )
    evidence = Evidence(numbers, say("handin_source_speed"), say("handin_rule_speed"))
    return Paragraph(say("handin_speed_title"), (sentence,), (evidence,), "")


# --- the top operators' layers -----------------------------------------------------------------------------------


def _operator_layers(inputs: ReportInputs, groups: Mapping[str, Mapping[str, str]], say: _Words) -> Paragraph | None:
    """Which layer each top operator serves (pipeline.report.operator_layers), and which layer takes most of each
    combination's traced operator time, where its traced pass ran like the timed steps."""
    records = [record for record in inputs.profiles if record.top_operators]
    if not records:
        return None
    listed = {
        name: {
            operator: group
            for operator, group in table.items()
            if any(
                row.operator == operator and row.share_pct >= LISTED_SHARE_PCT
                for record in records
                if record.combination.name == name
                for row in record.top_operators
            )
        }
        for name, table in groups.items()
    }
    gathered = operators_by_group(listed, GROUP_ORDER)
    if not gathered:
        return None
    mapping = say.joined(
        (
            say("handin_layer_operators", group=say.group(group), operators=say.joined(f"`{name}`" for name in names))
            for group, names in gathered.items()
        ),
        "list_separator",
    )
    sentences = [say("handin_layers", share=LISTED_SHARE_PCT, mapping=mapping)]
    evidence_numbers, items = [], []
    for (device, mode), group in itertools.groupby(
        sorted(records, key=lambda r: (r.combination.device, r.combination.mode, r.combination.batch_size)),
        key=lambda r: (r.combination.device, r.combination.mode),
    ):
        leading = []
        for record in group:
            shares = layer_shares(record) if record.traced_like_timed else []  # else its shares describe another step
            if shares:
                leading.append((record.combination.batch_size, shares[0]))
                evidence_numbers.append(
                    say(
                        "handin_evidence_layer",
                        combination=say.combination(device, mode),
                        batch=record.combination.batch_size,
                        group=say.group(shares[0].group),
                        share=_share_ci(shares[0].value, shares[0].low, shares[0].high, say),
                    )
                )
        if not leading:
            continue
        runs = [
            say(
                "handin_leading_run",
                batches=say.joined(str(batch) for batch, _ in run),
                group=say.group(layer),
                shares=say.joined(say("handin_pct", value=share.value) for _, share in run),
            )
            for layer, run in (
                (layer, list(run)) for layer, run in itertools.groupby(leading, key=lambda item: item[1].group)
            )
        ]
        items.append(
            say(
                "handin_leading_item",
                combination=say.combination(device, mode),
                runs=say.joined(runs, "conclusion_separator"),
            )
        )
    if items:
        sentences.append(say("handin_leading", items=say.joined(items, "list_separator")))
    evidence: tuple[Evidence, ...] = ()
    if evidence_numbers:
        evidence = (
            Evidence(
                say.joined(evidence_numbers, "list_separator"), _traced_source(inputs, say), say("handin_rule_layers")
            ),
        )
    return Paragraph(say("handin_layers_title"), tuple(sentences), evidence, "")


# --- the evidence table -------------------------------------------------------------------------------------------


def _evidence_table(rows: Sequence[tuple[str, Evidence]], say: _Words) -> str:
    header = [
        say(key)
        for key in (
            "handin_evidence_paragraph",
            "handin_evidence_numbers",
            "handin_evidence_source",
            "handin_evidence_rule",
        )
    ]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- | --- | --- |"]
    for title, row in rows:
        cells = (title, row.numbers, row.source, row.rule)
        lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
