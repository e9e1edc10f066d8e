"""The arithmetic-heads study's analyses (docs/methods.md §2, Zhang et al. 2024): capture, path patching and
attribution, knock-outs, attention, the MLP logit lens, ranking and the study."""

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
