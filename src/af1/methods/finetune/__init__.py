"""Precise fine-tuning (docs/methods.md §2), one module per part: the heads' slices, training, and the comparison
of precise, random-head and full fine-tuning."""

from af1.methods.finetune import compare, slices, train

__all__ = ["compare", "slices", "train"]
