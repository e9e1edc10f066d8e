"""The one legend of shape letters in tensor names (`ids_BT` is [batch, positions]): a name ends in `_` and one capital
per dimension (a digit: a fixed size, `1`: broadcast); each letter means one thing everywhere, checked by a test."""

from __future__ import annotations

LEGEND: dict[str, str] = {
    "A": "answer steps (the tokens of an answer, scored one after another)",
    "B": "a batch: problems or text windows run together",
    "C": "context positions (the constant prefix)",
    "D": "model width (hidden size)",
    "E": "concatenated head outputs, heads x head dimension (the input of o_proj)",
    "F": "flattened (layer, head, window) fits of the positional study",
    "G": "query heads that share one key-value head (grouped-query attention)",
    "H": "attention heads (query heads; key-value heads where a comment says so)",
    "I": "MLP neurons: the input of the MLP's output projection",
    "J": "key-value heads of attention",
    "K": "key positions of attention",
    "L": "decoder layers",
    "M": "a probe's label columns: the true labels, then permutations of them",
    "N": "windows of natural text (positional study)",
    "O": "a probe's outputs: the features it regresses (a value, or its points on circles)",
    "P": "problems of a task",
    "Q": "query positions of attention",
    "R": "readout rows: the correct answer token and the clean run's best wrong token",
    "S": "slots of a token-local table: one (position, token) pair each",
    "T": "positions of a sequence",
    "U": "suffix positions: the ones after the context (or the last positions a caller passes)",
    "V": "vocabulary",
    "W": "L_wait values (-1 .. L-1)",
    "X": "L_transfer values (0 .. L)",
    "Y": "the values a probe's target takes",
    "Z": "senders: the heads and MLPs whose output is patched",
    "d": "head dimension",
}
