"""Figures as PNG files: layer on the y-axis where a figure is indexed by layer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from af1.results import write_atomic
from af1.stats import with_ci

if TYPE_CHECKING:
    from af1.methods.allforone.necessity import Necessity
    from af1.methods.allforone.prune import Pruning
    from af1.methods.allforone.search import Found
    from af1.methods.allforone.sweep import Grid
    from af1.methods.heads.compared import Ranked
    from af1.methods.heads.study import HeadsStudy
    from af1.methods.neurons import Neurons
    from af1.methods.positional.study import Positional
    from af1.methods.probes import Probes
    from af1.methods.setup import SetupDescription


def _save(fig: Any, path: Path) -> Path:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return write_atomic(path, buf.getvalue())


def confident_cells(low_WK: list[list[float | None]], threshold: float) -> list[tuple[int, int]]:
    """(L_wait, L_transfer) of the cells whose whole 95 % interval (its lower ends by L_wait row from -1 and
    L_transfer column) lies at or above the threshold."""
    rows, cols = np.nonzero(np.nan_to_num(np.array(low_WK, dtype=float), nan=-1) >= threshold)
    return [(int(r) - 1, int(c)) for r, c in zip(rows, cols, strict=True)]  # row 0 is L_wait -1


def sweep_heatmap(grid: Grid, setup: SetupDescription, path: Path, found: Found | None = None) -> Path:
    """Faithfulness over (L_wait rows, L_transfer columns), annotated where cells are large enough; cells whose
    whole 95 % interval lies above the threshold (the search's, else 0.9) are marked; with `found` (the search's
    rule read off this grid), its frontier and judged cell."""
    faith = np.array(grid.faithfulness_wait_transfer, dtype=float)
    L = setup.n_layers
    fig, ax = plt.subplots(figsize=(min(14, 3 + 0.4 * L), min(12, 2.5 + 0.35 * L)))
    image = ax.imshow(np.ma.masked_invalid(faith), origin="lower", cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xlabel("L_transfer (layers in which the last token peeks)")
    ax.set_ylabel("L_wait (CAMA at the output of this block; -1 = none)")
    ax.set_yticks(range(L + 1), [str(w) for w in range(-1, L)], fontsize=7)
    ax.set_xticks(range(L + 1), [str(k) for k in range(L + 1)], fontsize=7)
    if L <= 32:
        for (r, c), v in np.ndenumerate(faith):
            if v == v:
                ax.text(
                    c,
                    r,
                    f"{v:.2f}"[1:] if v < 1 else "1",
                    ha="center",
                    va="center",
                    fontsize=5,
                    color="white" if v < 0.6 else "black",
                )
    threshold = found.threshold if found else 0.9
    marked = confident_cells(grid.ci_low_wait_transfer, threshold)
    ax.scatter(
        [k for _, k in marked],
        [w + 1.32 for w, _ in marked],
        marker="^",
        s=8,
        c="red",
        label=f"95 % interval at or above {threshold} (in-sample, uncorrected: descriptive)",
    )
    if found is not None:
        _mark_search(ax, found)
    ax.legend(loc="upper right", fontsize=7)
    fig.colorbar(image, ax=ax, label="faithfulness")
    ax.set_title(
        f"AF1 faithfulness: {setup.model} {setup.task} ({setup.style}, {setup.scoring} answer), n={setup.n_solved}, "
        f"constant guess {grid.faithfulness_baseline:.2f}"
    )
    return _save(fig, path)


def _mark_search(ax: Any, found: Found) -> None:
    """The search's frontier (orange) and its judged cell (red; dashed where none reached the threshold)."""
    if found.frontier:
        ax.plot(
            [f["transfer"] for f in found.frontier],
            [f["wait"] + 1 for f in found.frontier],
            color="orange",
            lw=1.2,
            marker="o",
            ms=3,
            label=f"frontier: smallest L_transfer reaching {found.threshold} (selection split)",
        )
    if (cell := found.judged) is not None:
        corner = (cell["transfer"] - 0.5, cell["wait"] + 0.5)
        ax.add_patch(Rectangle(corner, 1, 1, fill=False, ec="red", lw=2, ls="-" if found.chosen else "--"))


def search_cells(found: Found, n_layers: int, path: Path) -> Path:
    """The cells the search measured on the selection split: each one's rate where measured whole, else its misses
    of the problems measured before it stopped; cells it never measured stay empty (the rule did not need them)."""
    from af1.report.interactive import cell_text

    L, n = n_layers, found.n_selection
    rate_WK = np.full((L + 1, L + 1), np.nan)
    fig, ax = plt.subplots(figsize=(min(14, 3 + 0.4 * L), min(12, 2.5 + 0.35 * L)))
    for cell in found.measured:
        r, c = cell["wait"] + 1, cell["transfer"]
        rate_WK[r, c] = cell["right"] / cell["measured"]
        color = "white" if rate_WK[r, c] < 0.6 else "black"
        ax.text(c, r, cell_text(cell, n), ha="center", va="center", fontsize=5, color=color)
    image = ax.imshow(np.ma.masked_invalid(rate_WK), origin="lower", cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xlabel("L_transfer (layers in which the last token peeks)")
    ax.set_ylabel("L_wait (CAMA at the output of this block; -1 = none)")
    ax.set_yticks(range(L + 1), [str(w) for w in range(-1, L)], fontsize=7)
    ax.set_xticks(range(L + 1), [str(k) for k in range(L + 1)], fontsize=7)
    _mark_search(ax, found)
    if found.frontier:
        ax.legend(loc="upper right", fontsize=7)
    fig.colorbar(image, ax=ax, label="right / measured (selection split)")
    stopped = sum(c["measured"] < n for c in found.measured)
    ax.set_title(
        f"The cells the search measured: {len(found.measured)}, {stopped} stopped once decided (✗ misses / measured);\n"
        f"the rest on all {n} selection problems (their rate); the judged cell outlined",
        fontsize=9,
    )
    return _save(fig, path)


def necessity_plot(result: Necessity, path: Path) -> Path:
    shifted = result.shifted_transfer  # None where no AF1 was found to move the window in
    fig, axes = plt.subplots(1, 2 if shifted else 1, figsize=(11, 4), squeeze=False)
    ax = axes[0, 0]
    for width, values in result.windows.items():
        ax.plot(range(len(values)), values, marker="o", ms=3, label=f"{width} layer(s) from here")
    ax.set_xlabel("first blocked layer")
    ax.set_ylabel("faithfulness")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("last token cannot read the problem (operands, slots)")
    ax.legend(fontsize=8)
    if shifted:
        ax2 = axes[0, 1]
        starts = [s["start"] for s in shifted["by_start"]]
        ax2.plot(starts, [s["faithfulness"] for s in shifted["by_start"]], marker="o", ms=3)
        ax2.axvline(shifted["wait"] + 1, color="grey", ls=":")
        ax2.set_xlabel("first transfer layer")
        ax2.set_ylim(-0.02, 1.02)
        ax2.set_title(f"AF1 (wait {shifted['wait']}, transfer {shifted['transfer']}) with the window moved")
    return _save(fig, path)


def pruning_plot(result: Pruning, path: Path) -> Path:
    curve = result.faithfulness_vs_pruned
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(len(curve)), curve, marker="o", ms=3)
    ax.axhline(
        result.keep * result.faithfulness_full, color="grey", ls=":", label=f"{result.keep * 100:.0f} % of unpruned"
    )
    ax.set_xlabel(f"transfer heads that no longer peek (of {result.n_transfer_heads})")
    ax.set_ylabel("faithfulness")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    return _save(fig, path)


def positional_figures(result: Positional, path: Path) -> Path:
    """Pearson r per [layer, head] (trained), its distribution against random init, and the swap curve."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    r = np.array(result.r_layer_head, dtype=float)
    image = axes[0].imshow(r, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1)
    axes[0].set_xlabel("head")
    axes[0].set_ylabel("layer")
    axes[0].set_title("r of a[i-j] + b[i] + c[j] (trained)")
    fig.colorbar(image, ax=axes[0])
    bins = np.linspace(-0.2, 1, 40)
    for r_LH, label in (
        (result.r_layer_head, "trained"),
        (result.r_row_centred_layer_head, "trained, row-centred"),
        (result.r_random_init_layer_head, "random init"),
    ):
        axes[1].hist(np.array(r_LH, dtype=float).flatten(), bins=bins, alpha=0.5, label=label)
    axes[1].set_xlabel("Pearson r per head")
    axes[1].legend(fontsize=8)
    fractions = [float(f) for f in result.perplexity_vs_swap]
    axes[2].plot(fractions, list(result.perplexity_vs_swap.values()), marker="o", label="adjacent tokens swapped")
    axes[2].plot(fractions, list(result.perplexity_vs_position_swap.values()), marker="s", label="position ids swapped")
    axes[2].set_xlabel("fraction swapped")
    axes[2].set_ylabel("perplexity")
    axes[2].legend(fontsize=8)
    return _save(fig, path)


def heads_figures(result: HeadsStudy, path: Path) -> Path:
    """Path-patching effect per [layer, head] and per MLP layer, and the MLP logit lens."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [2, 1, 1]})
    name, values, key_high = result.ranked_effect()
    effect = np.array(values, dtype=float)
    lim = max(1e-6, float(np.nan_to_num(np.abs(effect)).max()))
    cmap = "RdBu_r" if key_high else "RdBu"  # key heads red either way
    image = axes[0].imshow(effect, origin="lower", aspect="auto", cmap=cmap, vmin=-lim, vmax=lim)
    axes[0].set_xlabel("head")
    axes[0].set_ylabel("layer")
    axes[0].set_title(f"{name} (path patching: {result.path})", fontsize=10)
    fig.colorbar(image, ax=axes[0])
    mlp = np.array(result.relative_logit_change_mlp_layer, dtype=float)
    axes[1].barh(range(len(mlp)), mlp)
    axes[1].set_ylabel("layer")
    axes[1].set_title("MLP effect")
    if result.mlp_logit_lens_layer is not None:
        lens = np.array(result.mlp_logit_lens_layer, dtype=float)
        axes[2].barh(range(len(lens)), lens)
    axes[2].set_title("MLP output through the final norm . answer unembedding")
    return _save(fig, path)


def neurons_plot(result: Neurons, path: Path) -> Path:
    """Faithfulness under AF1 as the top k neurons are mean-ablated, with intervals, beside each random set of k."""
    sizes, top, ci = result.sizes, result.top_faithfulness, np.asarray(result.top_faithfulness_ci)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.errorbar(
        sizes,
        top,
        yerr=[np.subtract(top, ci[:, 0]), ci[:, 1] - np.asarray(top)],
        marker="o",
        ms=3,
        capsize=2,
        label="top k by attribution",
    )
    for k, draws in zip(sizes, result.random_faithfulness, strict=True):
        ax.scatter([k] * len(draws), draws, color="grey", s=8, alpha=0.5)
    ax.scatter([], [], color="grey", s=8, label="random sets of k (same layers)")
    ax.axhline(result.faithfulness, color="green", lw=1, label="AF1, nothing ablated")
    ax.axhline(result.faithfulness / 2, color="orange", ls="--", lw=1, label="half of it")
    ax.axhline(result.faithfulness_baseline, color="grey", ls=":", lw=1, label="constant guess")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("neurons mean-ablated at the last token (k)")
    ax.set_ylabel("faithfulness (confirmation part)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    return _save(fig, path)


def attribution_plot(result: Ranked, path: Path) -> Path:
    """Each head's exact effect against its attribution estimate, the diagonal where they agree."""
    exact = np.asarray(result.exact_layer_head, dtype=float).ravel()
    estimate = np.asarray(result.estimate_layer_head, dtype=float).ravel()
    agreement = result.agreement
    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.scatter(exact, estimate, s=8, alpha=0.6)
    low, high = np.nanmin([exact, estimate]), np.nanmax([exact, estimate])
    ax.plot([low, high], [low, high], color="grey", ls=":")
    ax.set_title(f"Spearman's rho {with_ci(agreement['spearman'], agreement['spearman_ci'])}", fontsize=9)
    ax.set_xlabel(f"exact effect (path '{result.exact_path}')")
    ax.set_ylabel("attribution estimate")
    return _save(fig, path)


def probes_plot(result: Probes, path: Path) -> Path:
    """Held-out accuracy of the Fourier probes after every block, unmodified (left) and under AF1 (right, with the
    control with no transfer layers dotted), AF1's transfer blocks shaded."""
    panels = [("unmodified", result.unmodified, [])]
    if result.under_af1:
        panels.append(("under AF1", result.under_af1, result.no_transfer))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (title, curves, control) in zip(axes[0], panels, strict=True):
        for i, c in enumerate(x for x in curves if x["kind"] == "fourier"):
            colour = f"C{i}"
            ax.plot(range(len(c["accuracy"])), c["accuracy"], color=colour, marker="o", ms=2, label=c["target"])
            for d in control:
                if d["kind"] == "fourier" and d["target"] == c["target"]:
                    ax.plot(range(len(d["accuracy"])), d["accuracy"], color=colour, ls=":", lw=1)
        if result.wait is not None and result.transfer is not None:
            w, t = result.wait, result.transfer
            ax.axvspan(w + 0.5, w + t + 0.5, color="orange", alpha=0.15)
        ax.set_title(f"{title} (Fourier probes; dotted: no transfer layers)" if control else title, fontsize=9)
        ax.set_xlabel("after block")
        ax.set_ylim(-0.02, 1.02)
    axes[0, 0].set_ylabel("held-out accuracy")
    axes[0, 0].legend(fontsize=7)
    return _save(fig, path)
