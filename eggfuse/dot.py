"""Pictures of a rewrite: a graph before and after optimisation, and the e-class around a node
in the saturated e-graph, as Graphviz DOT, rendered by Graphviz's ``dot`` program when it is
installed.

Without ``dot`` on ``PATH`` (Debian: ``apt-get install graphviz``) a picture is written as
its DOT text instead, beside the requested path with the suffix ``.dot``, and
:func:`write` says so in what it returns; a path ending in ``.dot`` is always DOT text.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from eggfuse.ir import Graph, InputError


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def graph_dot(graph: Graph, title: str = "") -> str:
    """DOT of the live part of ``graph``: one box per node (``%id Op``, its type), an edge per input."""
    lines = ["digraph G {", "  rankdir=TB; node [shape=box, fontname=Helvetica, fontsize=10];"]
    if title:
        lines.append(f"  label={_quote(title)}; labelloc=t;")
    outputs = set(graph.outputs)
    for node in graph.live_nodes():
        name = node.attrs.get("name")
        label = f"%{node.id} {node.op}" + (f" {name}" if name else "") + f"\\n{node.type}"
        style = ", style=filled, fillcolor=lightgrey" if node.op in ("Input", "Parameter", "Constant") else ""
        style += ", peripheries=2" if node.id in outputs else ""
        lines.append(f"  n{node.id} [label={_quote(label)}{style}];")
        for i in node.inputs:
            lines.append(f"  n{i} -> n{node.id};")
    lines.append("}")
    return "\n".join(lines)


def eclass_dot(raw: dict, let: str, depth: int = 2) -> str:
    """DOT of the e-class holding the encoded node ``let`` (``$n<id>``) in egglog's serialised
    e-graph ``raw``: that e-class and the e-classes below it, ``depth`` levels down, each a
    cluster of its e-nodes, an edge from each e-node to the e-classes of its children.
    Raises :class:`~eggfuse.ir.InputError` when no e-class holds ``let``."""
    from eggfuse.rewrites.problem import Decoder

    dec = Decoder(raw)
    start = next((c for c, d in raw["class_data"].items() if let in (d.get("let") or "").split(", ")), None)
    if start is None:
        raise InputError(f"no e-class holds graph node {let[2:]} (is it a live node of the graph?)")
    level, seen = [start], {start: 0}
    for d in range(depth):
        nxt = []
        for c in level:
            for nid in dec.members.get(c, ()):
                for ch in raw["nodes"][nid]["children"]:
                    k = dec.cls[ch]
                    if k in dec.members and k not in seen:
                        seen[k] = d + 1
                        nxt.append(k)
        level = nxt
    lines = ["digraph E {", "  compound=true; node [shape=box, fontname=Helvetica, fontsize=10];"]
    for c in seen:
        lines.append(f"  subgraph {_quote('cluster_' + c)} {{ label={_quote(c)}; style=rounded;"
                     + (" color=red;" if c == start else ""))
        for nid in dec.members[c]:
            node = raw["nodes"][nid]
            lits = [raw["nodes"][ch]["op"] for ch in node["children"] if ch.startswith("primitive-")]
            label = node["op"] + (f"\\n{' '.join(lits)[:60]}" if lits else "")
            lines.append(f"    {_quote(nid)} [label={_quote(label)}];")
        lines.append(f"    {_quote('anchor_' + c)} [shape=point, style=invis];")
        lines.append("  }")
    for c, d in seen.items():
        if d == depth:
            continue
        for nid in dec.members[c]:
            for ch in raw["nodes"][nid]["children"]:
                k = dec.cls[ch]
                if k in seen:
                    lines.append(f"  {_quote(nid)} -> {_quote('anchor_' + k)} [lhead={_quote('cluster_' + k)}];")
    lines.append("}")
    return "\n".join(lines)


def write(dot: str, path: str | Path) -> str:
    """Write ``dot`` to ``path`` in the format its suffix names (``.svg``, ``.png``, ``.pdf``,
    ... through Graphviz's ``dot``; ``.dot``/``.gv`` as text). Returns a line saying what was
    written. Raises :class:`~eggfuse.ir.InputError` when ``dot`` fails."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt in ("dot", "gv", ""):
        path.write_text(dot)
        return f"DOT written to {path}"
    exe = shutil.which("dot")
    if exe is None:
        text_path = path.with_suffix(".dot")
        text_path.write_text(dot)
        return (f"Graphviz's dot is not installed: wrote the DOT text to {text_path} instead of {path} "
                f"(install Graphviz, e.g. apt-get install graphviz, or run: dot -T{fmt} {text_path} -o {path})")
    proc = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=dot, text=True, capture_output=True)
    if proc.returncode != 0:
        raise InputError(f"dot could not write {path}: {proc.stderr.strip()}")
    return f"{fmt.upper()} written to {path}"


__all__ = ["eclass_dot", "graph_dot", "write"]
