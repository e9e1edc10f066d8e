"""The arithmetic-heads study's analyses (docs/methods.md §2, Zhang et al. 2024), one module each: capture of
outputs, path patching and its first-order estimate (attribution), knock-outs, attention, the logit lens of MLPs,
ranking of key heads and the study."""

from af1.methods.heads import (
    attention,
    attribution,
    capture,
    compared,
    consistency,
    knockouts,
    lens,
    patching,
    ranking,
    study,
)

__all__ = [
    "attention",
    "attribution",
    "capture",
    "compared",
    "consistency",
    "knockouts",
    "lens",
    "patching",
    "ranking",
    "study",
]
