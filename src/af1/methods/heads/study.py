"""The heads study (docs/methods.md §2): ranking, knock-outs against matched random heads, and their claims."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from af1.claims import About, Claim, adjust, confirmed, share_above
from af1.errors import Af1Error
from af1.methods.counterfactuals import counterfactual_problems
from af1.methods.heads.attention import TokenAttention, last_query_attention, token_attention
from af1.methods.heads.compared import (
    NoSecondCounterfactual,
    SecondCounterfactual,
    TaskOverlap,
    second_ranking,
    task_overlap,
)
from af1.methods.heads.knockouts import CONFIRMATION, Knockout, knocked_out, knockout_warning
from af1.methods.heads.lens import mlp_logit_lens
from af1.methods.heads.patching import LayoutNotPatched, LayoutPatched, layout_path_patching
from af1.methods.heads.ranking import (
    THRESHOLDS,
    Ranked,
    ScoringNote,
    Settings,
    Split,
    effect_of,
    key_heads,
    problem_split,
)
from af1.models.adapter import ModelAdapter
from af1.progress import stage as progress_stage
from af1.results import Part
from af1.tasks.evaluation import Evaluated, evaluated, require_solved, solved
from af1.tasks.task import LayoutRow, Task

if TYPE_CHECKING:
    from af1.models.loading import LoadedModel
    from af1.tasks.spec import TaskSpec
    from af1.tasks.task import Tokenizer


class HeadsStudy(Part):
    """The arithmetic-heads study: path patching's effects, key and top heads chosen on the selection part, their
    knock-out and attention on the confirmation part, the MLP lens, a second counterfactual, other tasks."""

    model: str | None
    task: str
    style: str
    n: int
    n_solved: int
    layouts: list[LayoutRow]  # path patching, knock-outs and attention per layout, pooled by each one's n
    scoring: str
    path_patching_scoring: ScoringNote
    base_accuracy_all: float
    split: Split
    counterfactual: str
    counterfactual_kind: str
    counterfactual_problems: list[dict[str, Any]]
    n_heads: int
    threshold: float
    path: str
    metric: str  # what ranked the heads: the share where the counterfactual defines an answer, else relative
    contrast: str  # what the logit difference is against
    key_heads: list[list[int]]
    key_head_share: float
    key_heads_by_metric: dict[str, list[list[int]]]
    top_heads: list[list[int]]
    share_layer_head: list[list[float | None]] | None  # None: a counterfactual with no answer of its own
    relative_logit_change_layer_head: list[list[float | None]]
    logit_diff_change_layer_head: list[list[float | None]]
    relative_logit_change_mlp_layer: list[float | None]
    logit_diff_change_mlp_layer: list[float | None]
    clean_logit_diff: float
    counterfactual_gap: float  # the counterfactual run's mean change of the logit difference: the whole way
    answer_steps_n: dict[str, int]  # solved problems of the selection part with an answer step k, by k
    layouts_patched: list[LayoutPatched] | None = None  # a task of several layouts: those path patching measured
    layouts_not_patched: list[LayoutNotPatched] | None = None  # and those it left out, with why
    knockout: Knockout
    attention_of_top_heads: dict[str, dict[str, float]]
    attention_measured_on: str
    attention_over_tokens: TokenAttention | None
    mlp_logit_lens_layer: list[float | None] | None  # None: a family whose MLP output is not linear in its input
    mlp_logit_lens_measured_on: str
    second_counterfactual: SecondCounterfactual | NoSecondCounterfactual | None = None
    overlap: list[TaskOverlap]
    confirmed_key_heads: list[list[int]]  # key heads whose claim is confirmed on the confirmation part
    claims: list[Claim]  # each key head's, and the top heads' against matched random heads: one family

    def ranked_effect(self) -> tuple[str, list[list[float | None]], bool]:
        """What ranked the heads, per [layer, head], and whether a key head is high (the share) or low."""
        if self.share_layer_head is not None:
            return "share of the way to the counterfactual's answer", self.share_layer_head, True
        return "relative change of the correct logit", self.relative_logit_change_layer_head, False


def key_head_claims(
    adapter: ModelAdapter, tested_on: Task, tokenizer: Tokenizer, main: Ranked, keys: list[tuple[int, int]], s: Settings
) -> list[Claim]:
    """Each key head judged on the confirmation part where the counterfactual defines an answer: its share under the
    changing counterfactual against its keeping control's (`share_above`); otherwise none."""
    if not keys or main["metric"] != "share":
        return []
    layers = sorted({layer for layer, _ in keys})
    with progress_stage(f"key heads confirmed: path patching of {len(layers)} layers on the confirmation part, twice"):
        try:
            keep, _ = layout_path_patching(
                adapter, tested_on, tokenizer, s.path, s.kind, layers=layers, contrast="answer kept"
            )
        except Af1Error:  # no problem has an answer-keeping control: nothing to pair the claim with
            return []
        change, _ = layout_path_patching(
            adapter, tested_on, tokenizer, s.path, s.kind, layers=layers, contrast="answer"
        )
    controlled = [row is not None and row["control_input_ids"] is not None for row in change["counterfactual_rows"]]
    rows = [i for i, has in enumerate(controlled) if has]
    gap_P = change["counterfactual_gap_problem"][rows]
    on = f"the confirmation part ({len(rows)} solved problems that did not choose the head and have a control)"
    return [
        share_above(
            About(
                "key_head",
                f"head {layer}.{h} carries the answer: patched from the counterfactual it moves the answer more than "
                f"{main['threshold']} of the way to the counterfactual's answer beyond what it moves patched from "
                "the answer-keeping control (over these problems; the counterfactual's draws are one per problem)",
                on,
                f"{layer}.{h}",
            ),
            change["logit_diff_change_problem_layer_head"][rows, layer, h].tolist(),
            keep["logit_diff_change_problem_layer_head"][rows, layer, h].tolist(),
            gap_P.tolist(),
            main["threshold"],
        )
        for layer, h in keys
    ]


FAMILY = "the heads study"


def decide(claims: list[Claim]) -> tuple[list[Claim], list[list[int]]]:
    """The study's claims adjusted as one family (Holm), and the key heads that stay confirmed."""
    family = adjust(claims, FAMILY)
    return family, [list(map(int, h.split("."))) for h in confirmed(family, "key_head")]


def study(
    lm: LoadedModel,
    spec: TaskSpec,
    settings: Settings,
    *,
    second_kind: str | None,
    compare_specs: list[TaskSpec],
    done: Evaluated | None = None,
) -> HeadsStudy:
    """Path patching and key and top-k heads chosen on the selection part (the search's split where there is one),
    judged on the confirmation part; the lens, a second counterfactual and overlap with other tasks."""
    s, adapter = settings, lm.adapter
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    require_solved(int(done.base.correct_P.sum()), spec)
    kept = solved(done.task, done.base)
    sel, conf = problem_split(len(kept), s.split)
    chosen_on, tested_on = kept.subset(sel), kept.subset(conf)
    main = s.rank(lm, chosen_on, s.kind)
    keys = key_heads(main["effect"], main["threshold"], main["metric"])
    knockout, top_claim = knocked_out(adapter, done.task, tested_on, main["top_heads"], keys, s)
    claims = [*key_head_claims(adapter, tested_on, lm.tokenizer, main, keys, s), top_claim]
    result = HeadsStudy(
        model=lm.info.get("spec"),
        task=spec.name,
        style=spec.style_name,
        n=len(done.task),
        n_solved=len(kept),
        layouts=kept.layouts(),  # path patching, knock-outs and attention per layout, pooled by each one's n
        scoring=spec.scoring,
        base_accuracy_all=done.base.accuracy,
        split=split_record(s, len(sel), len(conf)),
        counterfactual_problems=counterfactual_problems(kept, sel, main["pp"]["counterfactual_rows"]),
        **patching_fields(main, keys, adapter.n_layers * adapter.n_heads),
        knockout=knockout,
        **looks(lm, kept, tested_on, main["top_heads"], keys),
        warnings=[w for w in [main["scoring"]["warning"], knockout_warning(knockout, spec.scoring)] if w],
        overlap=[],
        confirmed_key_heads=[],
        claims=[],
    )
    result.claims, result.confirmed_key_heads = decide(claims)
    result.layouts_patched = main["pp"].get("layouts_patched")
    result.layouts_not_patched = main["pp"].get("layouts_not_patched")
    if second_kind is not None:
        result.second_counterfactual = second_ranking(lm, chosen_on, kept, sel, main["top_heads"], s, second_kind)
    result.overlap = [task_overlap(lm, other, main["top_heads"], keys, s) for other in compare_specs]
    return result


def split_record(s: Settings, n_selection: int, n_confirmation: int) -> Split:
    return Split(
        {
            "from": s.split_from,
            "selection_fraction": s.split[0],
            "split_seed": s.split[1],
            "n_selection": n_selection,
            "n_confirmation": n_confirmation,
            "heads_chosen_on": "the selection part ("
            + ("attribution patching, an estimate" if s.ranked_by == "attribution" else "path patching")
            + ")",
            "tested_on": "the confirmation part (knock-outs, attention of the top heads)",
        }
    )


def patching_fields(main: Ranked, keys: list[tuple[int, int]], n_heads: int) -> dict[str, Any]:
    """What path patching measured on the selection part and the heads it chose."""
    pp = main["pp"]
    measured = ("share", "relative") if main["metric"] == "share" else ("relative", "logit_diff")
    return {
        "path_patching_scoring": main["scoring"],
        "counterfactual": main["counterfactual"],
        "counterfactual_kind": main["counterfactual_kind"],
        "n_heads": n_heads,
        "threshold": main["threshold"],
        "path": pp["path"],
        "metric": main["metric"],
        "contrast": pp["contrast"],
        "key_heads": [list(h) for h in keys],
        "key_head_share": len(keys) / n_heads,
        "key_heads_by_metric": {m: [list(h) for h in key_heads(effect_of(pp, m), THRESHOLDS[m], m)] for m in measured},
        "top_heads": [list(h) for h in main["top_heads"]],
        "share_layer_head": effect_of(pp, "share").tolist() if main["metric"] == "share" else None,
        "relative_logit_change_layer_head": pp["relative_logit_change_layer_head"].tolist(),
        "logit_diff_change_layer_head": pp["logit_diff_change_layer_head"].tolist(),
        "relative_logit_change_mlp_layer": pp["relative_logit_change_mlp_layer"].tolist(),
        "logit_diff_change_mlp_layer": pp["logit_diff_change_mlp_layer"].tolist(),
        "clean_logit_diff": float(pp["clean_logit_diff"]),
        "counterfactual_gap": float(pp["counterfactual_gap"]),
        "answer_steps_n": pp["answer_steps_n"],
    }


def looks(
    lm: LoadedModel, kept: Task, tested_on: Task, top: list[tuple[int, int]], keys: list[tuple[int, int]]
) -> dict[str, Any]:
    """Where the top heads look on the confirmation part, and the MLP logit lens on all solved problems."""
    lens = mlp_logit_lens(lm.adapter, kept)
    return {
        "attention_of_top_heads": last_query_attention(lm.adapter, tested_on, top[:5]),
        "attention_measured_on": CONFIRMATION,
        # one problem's tokens (the confirmation part's first): where each top and key head looks, token by token
        "attention_over_tokens": token_attention(
            lm.adapter, lm.tokenizer, tested_on, list(dict.fromkeys(top + keys))[:16]
        ),
        "mlp_logit_lens_layer": None if lens is None else lens.tolist(),
        "mlp_logit_lens_measured_on": "all solved problems (no head is chosen by it)",
    }
