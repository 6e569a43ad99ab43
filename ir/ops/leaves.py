"""Leaves: graph inputs (fed per run), parameters (uploaded once; ``state`` ones updated in
place across runs) and constants (baked into the graph). They are fed or uploaded, never
computed: no reference, kernel or gradient rule of their own (autodiff stops at them)."""

from __future__ import annotations

from ..spec import Attr, op

FAMILY = "leaves"


def _leaf_type(ts, a):
    return a["type"]


op("Input", (), _leaf_type, None, attrs=(Attr("name", "str"), Attr("type", "type")), dispatches=0, leaf=True,
   doc="a tensor fed at every run, of its type (f32, or u32 indices)")
op("Parameter", (), _leaf_type, None,
   attrs=(Attr("name", "str"), Attr("type", "type"), Attr("state", "bool", False)), dispatches=0, leaf=True,
   doc="a named f32 weight uploaded once per session; a ``state`` parameter (a KV cache, optimiser "
       "moments) lives on the device across runs and is zero-filled unless given")
op("Constant", (), _leaf_type, None, attrs=(Attr("name", "str"), Attr("value", "array"), Attr("type", "type")),
   dispatches=0, leaf=True, doc="an f32 array baked into the graph, uploaded once")
