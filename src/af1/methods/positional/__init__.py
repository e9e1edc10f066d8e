"""Attention logits as position + meaning (docs/methods.md §3, Han & Ji 2025), one module per part: the corpus, the
additive fit, RoPE's parts, word order and the study."""

from af1.methods.positional import corpus, fit, perturbation, rope, study

__all__ = ["corpus", "fit", "perturbation", "rope", "study"]
