"""The All-for-One study's analyses on a setup, one module each, named as their experiments (docs/methods.md §1).
Every rate carries its n, an exact 95 % interval and the constant-guess baseline on the same problems; every
measurement is scored over all answer steps of the task."""

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
