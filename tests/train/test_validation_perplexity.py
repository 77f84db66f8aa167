"""The validation perplexity (finecap.train.validators.validation_loss) is exp(loss) uncapped: until 2026-11-29 it was
exp(min(loss, 50)), e^50 for every loss above 50, which the log showed as the model's perplexity."""

import math

import pytest
import torch
from accelerate import Accelerator

from finecap.train.validators import perplexity, validation_loss


class Sure:
    """Scores every target token (id 0) at logit ``-margin`` against 0 for token 1: loss ``log(1 + e^margin)``."""

    def __init__(self, margin):
        self.margin = margin

    def __call__(self, batch):
        labels = batch["labels"]
        logits = torch.zeros(*labels.shape, 2, dtype=torch.float64)
        logits[..., 0] = -self.margin
        return logits


def collate(items):
    return {"labels": torch.zeros(len(items), 4, dtype=torch.long)}


@pytest.mark.parametrize("margin", [2.0, 60.0, 100.0])
def test_the_validation_perplexity_is_exp_of_the_loss_past_50(margin):
    got = validation_loss(Sure(margin), list(range(3)), collate, 2, Accelerator(cpu=True))
    assert got["loss"] == pytest.approx(math.log1p(math.exp(margin)), rel=1e-6)  # float32 cross-entropy
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]), rel=1e-9)  # e^100, not the former cap e^50


def test_a_loss_past_the_float_range_is_an_infinite_perplexity_not_an_error():
    assert perplexity(709.0) == pytest.approx(math.exp(709.0))
    assert perplexity(710.0) == math.inf and perplexity(math.inf) == math.inf
    assert math.isnan(perplexity(math.nan))
