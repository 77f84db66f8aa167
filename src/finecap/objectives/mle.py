"""Maximum likelihood: token cross-entropy of the reference caption under teacher forcing.

``logits[:, t]`` predicts ``labels[:, t]`` (the captioner aligns them, no shift here); padding positions carry the
label -100 and are ignored. The loss is the mean over all non-ignored tokens of the batch (token-level average, as
``torch.nn.CrossEntropyLoss``), so long captions weigh more than short ones, as in ClipCap. While a captioner
trains with gradient checkpointing (its ``scores_in_chunks``), the same mean is taken over the captions' per-token
log-probs scored in vocabulary chunks, so that the batch's ``(B, T, V)`` logits are never held.

Example::

    >>> import torch
    >>> logits = torch.zeros(1, 2, 4)  # uniform over 4 tokens
    >>> round(float(mle_loss(logits, torch.tensor([[1, -100]]))), 4)  # ln 4
    1.3863
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from finecap.contract import is_copy
from finecap.data.targets import IGNORE_INDEX
from finecap.objectives.base import ObjectiveOutput, unwrap
from finecap.objectives.token_means import TokenMeanObjective


def mle_loss(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy over positions whose label is not ``ignore_index`` (their mean, or ``reduction="sum"``, or
    ``"none"``: each position's, (B*T,), 0 where ignored); logits (B, T, V), labels (B, T). finecap's one masked
    cross-entropy: MLE, SMILE (on restricted logits), the validation loss and perplexity all use it."""
    B, T, V = logits.shape
    if not (labels != ignore_index).any():
        raise ValueError("mle_loss: every label is ignored (empty captions?)")
    flat = logits.reshape(B * T, V).float()  # (B*T, V)
    return F.cross_entropy(flat, labels.reshape(B * T), ignore_index=ignore_index, reduction=reduction)


class MLE(TokenMeanObjective):
    """``objective(model, batch)``: the MLE loss ``losses["mle"]``, plus token accuracy and token count as metrics.
    ``accuracy`` is a per-token metric: a step logs the share of every process's tokens predicted right
    (:mod:`finecap.objectives.token_means`), not the mean of the micro-batches' and processes' shares."""

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput:
        labels = batch["labels"]  # (B, T)
        valid = labels != IGNORE_INDEX  # (B, T)
        n = int(valid.sum())
        if n == 0:
            raise ValueError("mle_loss: every label is ignored (empty captions?)")
        # A CaptionerBase training under checkpointing scores the captions as given sequences in vocabulary chunks,
        # never holding (B, T, V) logits; stand-in models without the property give logits.
        if getattr(unwrap(model), "scores_in_chunks", False):
            scores = model(batch, sequences=batch["input_ids"], mask=valid, with_top=True)
            loss = -scores.logprobs.sum() / n  # the token mean of mle_loss: log-probs are 0 where labels are ignored
            correct = scores.top  # (B, T), false where ignored
        else:
            logits = model(batch)  # (B, T, V)
            loss = mle_loss(logits, labels)
            with torch.no_grad():
                correct = (logits.argmax(-1) == labels) & valid
        right = correct[valid].float()  # (n,) 1 where the token's top prediction is its label
        metrics = {"accuracy": self.token_means.add("accuracy", right, not is_copy(batch)), "tokens": n}
        return ObjectiveOutput(losses={"mle": loss}, metrics=metrics, num_items=n)  # a mean over n tokens


def build(cfg: Any = None) -> MLE:
    """Factory of the registry (``train.objective=mle``); MLE has no options."""
    return MLE()
