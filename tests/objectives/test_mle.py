import math
from types import SimpleNamespace

import pytest
import torch

from finecap.config import SmileConfig, load
from finecap.contract import StepInfo
from finecap.objectives import OBJECTIVES, ObjectiveOutput, get_objective
from finecap.objectives.mle import MLE, mle_loss
from finecap.objectives.smile import SmileObjective
from helpers.objective_steps import FixedLogits, OtherProcess

LN2, LN3, LN5 = math.log(2), math.log(3), math.log(5)


def _logits_labels():
    # Two captions, V = 3, T = 3; the last position of caption 0 and the last two of caption 1 are padding.
    logits = torch.tensor(
        [
            [[1.0, 0.0, 0.0], [0.0, LN2, 0.0], [50.0, -50.0, 9.0]],
            [[0.0, LN3, 0.0], [-7.0, 3.0, 20.0], [1.0, 2.0, 3.0]],
        ]
    )
    labels = torch.tensor([[0, 1, -100], [0, -100, -100]])
    return logits, labels


def test_mle_loss_hand_computed():
    logits, labels = _logits_labels()
    # token 1: softmax([1, 0, 0])[0] = e / (e + 2)        -> -log = ln(e + 2) - 1 = 1.551445 - 1 = 0.551445
    # token 2: softmax([0, ln2, 0])[1] = 2 / (1 + 2 + 1)   -> -log = ln 2 = 0.693147
    # token 3: softmax([0, ln3, 0])[0] = 1 / (1 + 3 + 1)   -> -log = ln 5 = 1.609438
    # padding ignored; mean over the 3 real tokens = (0.551445 + 0.693147 + 1.609438) / 3 = 0.951343
    expected = (math.log(math.e + 2) - 1 + LN2 + LN5) / 3
    assert expected == pytest.approx(0.951343, abs=1e-6)
    assert float(mle_loss(logits, labels)) == pytest.approx(expected, abs=1e-6)


def test_mle_loss_ignores_padding_logits_and_has_no_gradient_there():
    logits, labels = _logits_labels()
    other = logits.clone()
    other[0, 2] = torch.tensor([-3.0, 8.0, 1.0])  # change only padding positions
    other[1, 1:] = 0.0
    assert torch.equal(mle_loss(logits, labels), mle_loss(other, labels))
    logits.requires_grad_(True)
    mle_loss(logits, labels).backward()
    assert torch.all(logits.grad[0, 2] == 0) and torch.all(logits.grad[1, 1:] == 0)
    # gradient of the mean CE at a real position: (softmax - onehot) / 3; position (0, 1): softmax = [1/4, 1/2, 1/4]
    assert torch.allclose(logits.grad[0, 1], torch.tensor([0.25, -0.5, 0.25]) / 3, atol=1e-6)


def test_mle_loss_all_ignored_is_an_error():
    with pytest.raises(ValueError, match="every label is ignored"):
        mle_loss(torch.zeros(1, 2, 3), torch.full((1, 2), -100))


def test_mle_objective_output():
    logits, labels = _logits_labels()
    out = MLE()(FixedLogits(logits), {"labels": labels})
    assert isinstance(out, ObjectiveOutput) and set(out.losses) == {"mle"}
    assert out.losses["mle"].item() == pytest.approx((math.log(math.e + 2) - 1 + LN2 + LN5) / 3, abs=1e-6)
    # argmax predictions at real positions: 0 (right), 1 (right), 1 (label 0: wrong) -> accuracy 2/3
    assert out.metrics == {"accuracy": pytest.approx(2 / 3), "tokens": 3}
    # the engine weighs micro-batches by num_items: tokens, not the 2 captions (only the slow 2-process equivalence
    # test noticed sequences instead), for MLE and for SMILE alike
    assert out.num_items == 3
    model = FixedLogits(logits)
    model.tokenizer = type("Tokenizer", (), {"eos_token_id": 2})()
    assert SmileObjective(SmileConfig(subset="full"))(model, {"labels": labels}).num_items == 3
    out.losses["mle"].backward()  # the loss carries gradient to the model


# The step's micro-batches on this process, over _logits_labels' logits, whose top tokens are 0, 1, 0 (caption 0) and
# 1, 2, 2 (caption 1): 5 tokens of which 4 are right (label 0 at (1, 1), where 2 is on top), 1 token that is wrong
# (label 2 at (0, 0)), and a copy (an epoch's last global batch: its tokens are counted where it was cut from) of 2
# right tokens.
STEP = [[[0, 1, 0], [1, 0, -100]], [[2, -100, -100], [-100, -100, -100]], [[0, 1, -100], [-100, -100, -100]]]


def _teacher_forced_step(objective, others):
    """One step of ``objective`` over :data:`STEP` in a run of two processes, the other's ``[sum, count]`` per
    per-token metric hand-made (``others``): each micro-batch's metrics and the step's values."""
    logits, _ = _logits_labels()
    model = FixedLogits(logits)
    model.tokenizer = SimpleNamespace(eos_token_id=2)
    objective.setup(SimpleNamespace(accelerator=OtherProcess(others)))
    outs = []
    for k, labels in enumerate(STEP):
        info = StepInfo(step=0, image_ids=[0, 1], copy=k == 2)
        outs.append(objective(model, {"labels": torch.tensor(labels), "step_info": info}).metrics)
    objective.end_step()
    return outs, objective.step_values()


def test_mle_accuracy_is_the_steps_share_of_every_processs_tokens_predicted_right():
    # This process: 4 of 5 tokens right, then 0 of 1 (the copy's 2 of 2 are not counted); the other process: 6 of 10.
    # The step's accuracy is 10 / 16 = 0.625. What the log held until 2026-11-29: the mean over the processes of the
    # mean of each one's micro-batch shares, ((0.8 + 0) / 2 + 0.6) / 2 = 0.5 (the copy left out by the engine).
    mle = MLE()
    outs, values = _teacher_forced_step(mle, {"accuracy": [6.0, 10.0]})
    assert [out["accuracy"] for out in outs] == [pytest.approx(0.8), 0.0, 1.0]  # each micro-batch's own share
    assert [out["tokens"] for out in outs] == [5, 1, 2]
    assert values == {"accuracy": 0.625}
    mle.end_step()  # the next step starts from 0: one of no token logs no accuracy
    assert mle.step_values() == {}


def test_smiles_mle_loss_is_the_steps_token_mean_over_every_processs_tokens():
    # SMILE logs the MLE loss of its batch, a per-token mean like MLE's accuracy: the step's is the mean cross-entropy
    # of every process's tokens, (5 x the first micro-batch's mean + 1 x the second's + the other's 20) / 16.
    logits, _ = _logits_labels()
    means = [float(mle_loss(logits, torch.tensor(labels))) for labels in STEP]
    outs, values = _teacher_forced_step(SmileObjective(SmileConfig(subset="full")), {"mle_loss": [20.0, 10.0]})
    assert [out["mle_loss"] for out in outs] == pytest.approx(means)
    assert values == {"mle_loss": pytest.approx((5 * means[0] + means[1] + 20.0) / 16, rel=1e-6)}
    assert abs(values["mle_loss"] - ((means[0] + means[1]) / 2 + 2.0) / 2) > 0.1  # what the log held


def make_factory(cfg):
    return MLE()


def test_registry_names_dotted_paths_and_errors():
    cfg = load()
    assert "mle" in OBJECTIVES
    assert isinstance(get_objective("mle", cfg), MLE)
    assert isinstance(get_objective(f"{__name__}:make_factory", cfg), MLE)
    with pytest.raises(ValueError, match=r"unknown objective 'nope'; valid names: .*mle"):
        get_objective("nope", cfg)
    with pytest.raises(ValueError, match="cannot import module"):
        get_objective("no_such_pkg.mod:factory", cfg)
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        get_objective(f"{__name__}:missing", cfg)


def test_every_registered_objective_resolves_to_a_factory():
    from finecap.objectives import import_object

    for name, path in OBJECTIVES.items():
        assert callable(import_object(path, f"OBJECTIVES[{name!r}]")), name
