"""The positional study's held-out window-by-window claims: a meaning term beyond position alone (against its
chance null) and word order (against the same tokens shuffled)."""

from __future__ import annotations

import torch

from af1.claims import About, Claim, paired_greater
from af1.methods.positional.fit import median

ROUNDING = 1e-6  # a held-out r gain this small is float32 rounding: position alone fits the logits as well


def window_claims(
    r_LHN: torch.Tensor,
    pos_LHN: torch.Tensor,
    permuted_LHN: torch.Tensor,
    shuffled_LHN: torch.Tensor,
    where: str,
    seed: int,
) -> tuple[Claim, Claim]:
    """The held-out window-by-window claims (paired permutation tests): the meaning term adds to position beyond the
    same term with token identities permuted, and word order shapes the decomposition (against shuffled tokens)."""

    def gain(fit_LHN: torch.Tensor) -> list[float]:
        """Per held-out window, the median head's r gain over position alone."""
        gain_N = median((fit_LHN - pos_LHN).flatten(0, 1), dim=0)  # per held-out window, the median head's gain
        return torch.where(gain_N.abs() > ROUNDING, gain_N, 0.0).tolist()  # within float rounding: no gain

    def claim(kind: str, statement: str, a: list[float], b: list[float]) -> Claim:
        """That `a` is above `b`: a paired permutation test over the held-out windows."""
        return paired_greater(About(kind, statement, where), a, b, seed=seed, unit="held-out windows")

    meaning = claim(
        "meaning_term",
        "a meaning term that is a function of the key's token, fitted on other windows, adds to position alone "
        "(the first key, a sink's place, its own positional term) on held-out windows more than the same term "
        "read with the token identities permuted across the split (row-centred r)",
        gain(r_LHN),
        gain(permuted_LHN),
    )
    word_order = claim(
        "word_order",
        "the text's word order makes it fit better: on each held-out window, the median head's r on the text is "
        "above that on the same tokens shuffled",
        median(r_LHN.flatten(0, 1), dim=0).tolist(),
        median(shuffled_LHN.flatten(0, 1), dim=0).tolist(),
    )
    return meaning, word_order
