"""The text the positional study reads: the shipped chapter (or a file), cut into windows that start as the model's
documents do."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from af1.errors import Af1Error
from af1.models.adapter import ModelAdapter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


CORPUS_NAME = "austen_pride_and_prejudice_ch1.txt"
CORPUS_SOURCE = "Jane Austen, Pride and Prejudice (1813), chapter 1; public domain"
MIN_CI_WINDOWS = 10  # fewer windows than this: the bootstrap interval over windows is flagged


def load_corpus(path: str | Path | None = None) -> str:
    """The shipped public-domain sample, or a user's text file."""
    if path is None:
        text = resources.files("af1").joinpath("data").joinpath(CORPUS_NAME).read_text()
    else:
        path = Path(path)
        if not path.is_file():
            raise Af1Error(f"corpus file not found: {path}")
        text = path.read_text()
    if not text.strip():
        raise Af1Error(f"corpus file is empty: {path or CORPUS_NAME}")
    return text


def corpus_windows(
    adapter: ModelAdapter,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    length: int,
    n_windows: int,
    start_token: int | None = None,
) -> torch.Tensor:
    """[window, position] token ids: consecutive windows of the tokenized text, each led by `start_token` (the
    model's document start) when given."""
    limit = getattr(adapter.config, "max_position_embeddings", None) or getattr(adapter.config, "n_positions", None)
    if limit and length > limit:
        raise Af1Error(f"window {length} is longer than the model's context of {limit} tokens")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    body = length - (start_token is not None)
    available = len(ids) // body if body > 0 else 0
    if available == 0:
        raise Af1Error(f"the corpus has {len(ids)} tokens, fewer than one window of {length}")
    n = min(n_windows, available)
    windows = torch.tensor(ids[: n * body]).view(n, body)
    if start_token is not None:
        windows = torch.cat([torch.full((n, 1), start_token), windows], 1)
    return windows


def window_warnings(n_windows: int, asked: int, window: int) -> list[str]:
    """Lines saying that the corpus held fewer windows than asked, and that an interval over few windows means
    little."""
    out = []
    if n_windows < asked:
        out.append(f"the corpus holds {n_windows} windows of {window} tokens, fewer than the {asked} asked for")
    if n_windows < MIN_CI_WINDOWS:
        out.append(
            f"the bootstrap intervals (median_ci) resample only {n_windows} windows, fewer than {MIN_CI_WINDOWS}: "
            "they say little (a shorter window, more n_windows or a longer corpus give more)"
        )
    return out


def shuffled(ids_NT: torch.Tensor, first: int, seed: int) -> torch.Tensor:
    """Each window's tokens in a seeded random order, its first `first` (the document start) kept in place."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.cat([w[:first], w[first:][torch.randperm(len(w) - first, generator=g)]]) for w in ids_NT])
