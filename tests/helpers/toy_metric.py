"""A metric group of one's own, plugged in by dotted path as docs/architecture.md ("How to add a metric") says:
``finecap eval --metrics bleu,helpers.toy_metric:GROUP`` or ``eval.metrics: [helpers.toy_metric:GROUP]``.

``toy/unmatched`` is the mean number of distinct words of a caption found in none of its references (PTB-tokenised):
words the references do not back, so lower is better.
"""

from __future__ import annotations

from finecap.metrics.context import EvalContext
from finecap.metrics.group import Column, MetricGroup


def unmatched_words(ctx: EvalContext) -> dict[str, float]:
    predictions, references = ctx.tok_predictions(), ctx.tok_references("toy")
    per_image = {
        i: {"toy/unmatched": float(len(set(caption.split()) - {w for r in references[i] for w in r.split()}))}
        for i, caption in predictions.items()
    }
    ctx.add_items(per_image, ["toy/unmatched"])
    return {"toy/unmatched": sum(v["toy/unmatched"] for v in per_image.values()) / len(per_image)}


GROUP = MetricGroup(
    "toy", unmatched_words, reads=frozenset({"references"}), columns=(Column("toy/unmatched", "lower"),)
)
