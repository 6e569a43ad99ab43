"""The one helper rule authors need: a named, optionally guarded equality."""

from __future__ import annotations

from egglog import rule, union


def equal(name: str, lhs, rhs, *guards):
    """The rule ``lhs = rhs`` (``rhs`` joins ``lhs``'s e-class) when every guard holds.

    ``name`` is the rule's label in reports and ``eggfuse rules``, written ``lhs -> rhs``;
    it must be unique. ``guards`` are egglog facts over the pattern variables, typically
    analysis reads such as ``eq(shape(d)).to(s)``. Being an equality, the rule never
    removes the left side: extraction decides which form is computed.
    """
    return rule(lhs, *guards, name=name).then(union(lhs).with_(rhs))
