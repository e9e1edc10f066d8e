"""The All-for-One study's analyses on a setup, one module per experiment (docs/methods.md §1). Every rate carries its
n, an exact 95 % interval and the constant guess on the same problems, scored over all answer steps."""

from af1.methods.allforone import (
    alternatives,
    components,
    faithfulness,
    groups,
    necessity,
    prune,
    search,
    styles,
    sweep,
    transfer,
)

__all__ = [
    "alternatives",
    "components",
    "faithfulness",
    "groups",
    "necessity",
    "prune",
    "search",
    "styles",
    "sweep",
    "transfer",
]
