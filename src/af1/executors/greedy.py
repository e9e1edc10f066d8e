"""Greedy next tokens without a full float32 unembedding: a bfloat16 screen, then float32 on the few candidates.
Its rounding bound assumes float32 accumulation (PyTorch's CPU kernels); the token is float32's argmax, up to ties."""

from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass

import torch

from af1.models.adapter import ModelAdapter, weight_of

U = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits)
F32 = 2.0**-24  # of float32
SLACK = 1.25  # on top of the bound below, for what the bound's own float arithmetic rounds


@dataclass
class Screen:
    """The bfloat16 unembedding (bias as one more column) transposed for the screen, the largest norms of its rows and
    their rounding errors, and the weight's version and storage (a fine-tuned or cast unembedding is screened anew)."""

    w_DV: torch.Tensor
    max_norm: float
    max_error_norm: float
    version: tuple[int, int]


_SCREENS: weakref.WeakKeyDictionary[torch.nn.Module, Screen] = weakref.WeakKeyDictionary()


def _with_bias(lm_head: torch.nn.Module) -> torch.Tensor:
    """[V, D (+1)]: the unembedding, with its bias as a last column when it has one."""
    W = weight_of(lm_head).detach().float()
    bias = getattr(lm_head, "bias", None)
    return W if bias is None else torch.cat([W, bias.detach().float()[:, None]], 1)


def screen_of(lm_head: torch.nn.Module) -> Screen:
    weight = weight_of(lm_head)
    version = (weight._version, weight.data_ptr())
    found = _SCREENS.get(lm_head)
    if found is None or found.version != version:
        W = _with_bias(lm_head)
        rounded = W.to(torch.bfloat16)
        error = float((rounded.float() - W).norm(dim=-1).max())
        found = Screen(rounded.T.contiguous(), float(rounded.float().norm(dim=-1).max()), error, version)
        _SCREENS[lm_head] = found
    return found


def usable(adapter: ModelAdapter) -> bool:
    """The screen needs the unembedding on the CPU in float32 (elsewhere the plain logits are as cheap), and a CPU
    whose bfloat16 products are faster than its float32 ones (without bf16 dot products they are ~100x slower)."""
    W = weight_of(adapter.lm_head)
    return W.device.type == "cpu" and W.dtype == torch.float32 and not adapter.offloaded() and bf16_pays()


@functools.cache
def bf16_pays() -> bool:
    """Whether a bfloat16 matrix product beats float32 on this CPU, measured once per process on an unembedding-shaped
    slice; only the time differs, never the tokens."""
    x_BD, w_DV = torch.randn(16, 512), torch.randn(512, 4096)
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = x_BD.to(dtype), w_DV.to(dtype)
        torch.mm(a, b)  # warm-up
        start = time.perf_counter()
        for _ in range(3):
            torch.mm(a, b)
        times[dtype] = time.perf_counter() - start
    return times[torch.bfloat16] < 0.8 * times[torch.float32]


MAX_CANDIDATES = 64  # a row with more candidates is scored in full (the screen did not narrow it)
ROWS = 256  # rows screened at once: the bfloat16 logits of a chunk stay a few tens of MB


@torch.no_grad()
def greedy_tokens(adapter: ModelAdapter, h_BD: torch.Tensor) -> torch.Tensor:
    """The argmax token [B] of the logits `adapter.logits` gives for final hidden states h [B, D]."""
    if not usable(adapter):  # in chunks: the float32 logits of thousands of rows of a large vocabulary are GBs
        return torch.cat([adapter.logits(h[:, None])[:, -1].float().argmax(-1).cpu() for h in _chunks(h_BD)])
    return screened_tokens(adapter, h_BD)


def _chunks(h_BD: torch.Tensor) -> list[torch.Tensor]:
    return [h_BD[i : i + ROWS] for i in range(0, len(h_BD), ROWS)]


@torch.no_grad()
def screened_tokens(adapter: ModelAdapter, h_BD: torch.Tensor) -> torch.Tensor:
    """`greedy_tokens` through the screen whether or not it pays on this CPU (a float32 unembedding on the CPU)."""
    return torch.cat([_screened(adapter, h) for h in _chunks(h_BD)])


def _screened(adapter: ModelAdapter, h_BD: torch.Tensor) -> torch.Tensor:
    x_BD = adapter.final_norm(h_BD).float()
    if getattr(adapter.lm_head, "bias", None) is not None:
        x_BD = torch.cat([x_BD, torch.ones_like(x_BD[:, :1])], 1)
    screen = screen_of(adapter.lm_head)
    rounded_BD = x_BD.to(torch.bfloat16)
    z_BV = rounded_BD @ screen.w_DV
    # |screen - exact| per row, with w^, x^ the rounded vectors: w^.(x^ - x) + (w^ - w).x (Cauchy-Schwarz), the
    # float32 accumulation over D terms, then the bfloat16 result's own rounding.
    high_B = z_BV.amax(-1).float()
    x_norm_B = x_BD.norm(dim=-1)
    inputs_B = (
        (rounded_BD.float() - x_BD).norm(dim=-1) * screen.max_norm
        + screen.max_error_norm * x_norm_B
        + x_BD.shape[1] * F32 * screen.max_norm * x_norm_B * (1 + U)
    )
    # a token whose exact logit could reach the best one's (or its float32 value could) lies within 3 bounds of
    # it; the result's rounding matters only for logits that near the best one: at most |best| + 4 input bounds
    bound_B = SLACK * (inputs_B + U * (high_B.abs() + 4 * inputs_B))
    floor_B = high_B - 3 * bound_B
    floor_B = floor_B - floor_B.abs() * 2 * U  # still below after its own rounding to bfloat16
    floor_B = floor_B.to(torch.bfloat16)
    token_B = torch.empty(len(x_BD), dtype=torch.long)
    k = min(MAX_CANDIDATES + 1, z_BV.shape[1])
    flat = z_BV.topk(k, dim=-1).values[:, -1] >= floor_B  # near-flat logits (or a tiny vocabulary): score them all
    if bool(flat.any()):
        token_B[flat] = adapter.logits(h_BD[flat][:, None])[:, -1].float().argmax(-1).cpu()
    if not bool(flat.all()):
        keep = (~flat).nonzero().flatten()
        token_B[keep] = _best_candidates(adapter, x_BD[keep], z_BV[keep] >= floor_B[keep, None])
    return token_B


def _best_candidates(adapter: ModelAdapter, x_BD: torch.Tensor, candidates_BV: torch.Tensor) -> torch.Tensor:
    """Each row's argmax over its candidate tokens, scored in float32 as `adapter.logits` would."""
    rows, columns = candidates_BV.nonzero(as_tuple=True)
    W = weight_of(adapter.lm_head)
    bias = getattr(adapter.lm_head, "bias", None)
    exact = (x_BD[rows, : W.shape[1]] * W[columns]).sum(-1)
    if bias is not None:
        exact = exact + bias[columns].float()
    exact = adapter.soft_capped(exact)
    best_B = torch.full((len(x_BD),), -float("inf")).scatter_reduce(0, rows, exact, "amax")
    winner = exact == best_B[rows]  # the first (lowest) token among equals, as argmax picks
    return torch.full((len(x_BD),), torch.iinfo(torch.long).max).scatter_reduce(
        0, rows[winner], columns[winner], "amin"
    )


MAX_RIVALS = 64  # rival tokens checked before the unembedding


@torch.no_grad()
def rival_wins(adapter: ModelAdapter, h_BD: torch.Tensor, target_B: torch.Tensor, rivals: list[int]) -> torch.Tensor:
    """[B] bool: where a rival's logit beats the target's beyond float rounding, so the greedy token is surely not the
    target; all False where the bound fails (soft cap, low precision, offloaded). `rivals`: distinct, <= MAX_RIVALS."""
    W = weight_of(adapter.lm_head)
    out_B = torch.zeros(len(h_BD), dtype=torch.bool)
    if not rivals or adapter.soft_cap or W.dtype != torch.float32 or adapter.offloaded():
        return out_B
    bias = getattr(adapter.lm_head, "bias", None)
    for start in range(0, len(h_BD), ROWS):
        x_BD = adapter.final_norm(h_BD[start : start + ROWS]).float()
        t_B = target_B[start : start + ROWS].to(W.device)
        tokens_BC = torch.cat([t_B[:, None], torch.tensor(rivals, device=W.device).expand(len(x_BD), -1)], 1)
        w_BCD = W[tokens_BC]
        z_BC = torch.einsum("bd,bcd->bc", x_BD, w_BCD)
        if bias is not None:
            z_BC = z_BC + bias.float()[tokens_BC]
        # |float32 logit - exact| <= D u |x| |w| + u |z| for a dot product of D terms; two computations, two tokens
        bound_BC = x_BD.shape[1] * F32 * x_BD.norm(dim=-1)[:, None] * w_BCD.norm(dim=-1) + F32 * z_BC.abs()
        bound_BC = 2 * SLACK * (bound_BC + bound_BC[:, :1])
        ahead_BC = (z_BC[:, 1:] - z_BC[:, :1] > bound_BC[:, 1:]) & (tokens_BC[:, 1:] != t_B[:, None])
        out_B[start : start + len(x_BD)] = ahead_BC.any(-1).cpu()
    return out_B
