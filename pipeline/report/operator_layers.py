"""Which layer each operator of the operator tables serves, and how much of a traced step each layer takes.

An operator is put in the layer group the step anatomy puts its time in (`StepAnalysis.parts`): inside the
optimizer's ranges, the Adadelta update; under an autograd node, the node's layer; otherwise its outermost
operator's layer (pipeline.profiling.trace_analysis). Here that classification is applied to each call of each
operator of the combination's trace (`traces/<device>/<batch>-<mode>.json.gz`): an operator whose every call lands
in one group is that group's; one whose calls spread over several groups (`aten::copy_`, `aten::empty`) belongs to
none. Where the trace is not on disk (it lives in DVC's cache), only the operator's name is read (`layer_group`),
which cannot see an optimizer range: the update's operators are then in no group. Torch-free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# The step anatomy's own classification, applied per call (trace_analysis sums it by part; it has no per-operator
# view): the step windows, the nesting of events and each operator's (phase, group).
from pipeline.profiling.trace_analysis import (
    OPERATOR_NAME,
    StepSpans,
    layer_group,
    nest_events,
    operator_context,
    read_trace,
)
from pipeline.records.profile import ProfileRecord
from pipeline.report.findings import TracedSteps, measured

NO_GROUP = ""  # an operator whose calls spread over several layers, or whose name names none
SHARE_SEED = 20261128  # the bootstrap of the layers' shares (a fixed seed: the same report from the same records)


def operator_groups(record: ProfileRecord) -> dict[str, str]:
    """Each operator of `record`'s table -> the layer group it serves (NO_GROUP for none), from its trace where it
    is on disk, else from the operator's name."""
    names = [row.operator for row in record.top_operators]
    trace_path = record.combination.outputs.trace
    if not trace_path.is_file():
        return {name: _by_name(name) for name in names}
    trace = read_trace(trace_path)
    window = StepSpans(trace.steps)
    host = [event for event in trace.host if window.index(event.start_us) is not None]
    parents = nest_events(host)
    is_operator = [event.category == "cpu_op" and OPERATOR_NAME.match(event.name) is not None for event in host]
    groups: dict[str, set[str]] = defaultdict(set)
    for index, event in enumerate(host):
        if is_operator[index] and event.name in names:
            groups[event.name].add(operator_context(index, host, parents, is_operator)[1])
    return {name: _named(next(iter(groups[name]))) if len(groups[name]) == 1 else NO_GROUP for name in names}


def _by_name(name: str) -> str:
    return _named(layer_group(name))


def _named(group: str) -> str:
    """A layer group, or NO_GROUP for "other" (the operators no layer's name claims)."""
    return NO_GROUP if group == "other" else group


@dataclass(frozen=True)
class LayerShare:
    """A layer group's share of a traced step's operator time (time outside operators left out), with its bootstrap
    interval over the traced steps."""

    group: str
    value: float  # %
    low: float
    high: float


def layer_shares(record: ProfileRecord) -> list[LayerShare]:
    """Each layer group's share of the traced steps' operator time, largest first; empty without traced parts."""
    parts = record.analysis.parts
    if not parts or len({len(part.step_ms) for part in parts}) != 1 or len(parts[0].step_ms) < 2:
        return []
    traced = TracedSteps(record, SHARE_SEED)
    inside = [group for group in dict.fromkeys(part.group for part in parts) if group != "outside"]

    def selected(groups: set[str]) -> tuple[float, np.ndarray]:
        def select(_phase: str, group: str) -> bool:
            return group in groups

        return traced.mean(select), traced.draws_of(select)

    operators_mean, operators_draws = selected(set(inside))
    if operators_mean <= 0:
        return []
    shares = []
    for group in inside:
        mean, draws = selected({group})
        share = measured(100 * mean / operators_mean, 100 * draws / operators_draws)
        shares.append(LayerShare(group, share.value, share.low, share.high))
    return sorted(shares, key=lambda share: -share.value)


def operators_by_group(groups: Mapping[str, Mapping[str, str]], order: Sequence[str]) -> dict[str, list[str]]:
    """Every table's operators gathered by group (NO_GROUP last), each group's in the order first seen."""
    gathered: dict[str, list[str]] = {group: [] for group in (*order, NO_GROUP)}
    for table in groups.values():
        for operator, group in table.items():
            bucket = gathered.setdefault(group, [])
            if operator not in bucket:
                bucket.append(operator)
    return {group: names for group, names in gathered.items() if names}
