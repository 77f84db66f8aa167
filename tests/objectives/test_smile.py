"""SMILE loss against hand-computed values on a 5-word vocabulary.

Every position uses the logits z = log([1, 2, 3, 4, 5]), so the softmax of id j over a subset S is
(j + 1) / sum_{i in S} (i + 1).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from finecap.config import ConfigError, SmileConfig
from finecap.objectives.smile import smile_loss, subset_mask

Z = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))


def logits_for(labels: torch.Tensor) -> torch.Tensor:
    B, T = labels.shape
    return Z.expand(B, T, 5).clone()  # (B, T, V)


def test_full_equals_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7)
    labels = torch.tensor([[1, 2, 3, -100], [0, 0, -100, -100], [6, 5, 4, 3]])
    expected = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), ignore_index=-100)
    got = smile_loss(logits, labels, SmileConfig(subset="full"))
    assert got.item() == pytest.approx(expected.item(), abs=1e-6)


def test_sequence_subset_hand_computed():
    labels = torch.tensor([[2, 0, 2, -100]])  # V_D = {0, 2}: exps 1 and 3
    # first_token=none: p(2) = 3/4, p(0) = 1/4, p(2) = 3/4 -> mean(log 4/3, log 4, log 4/3)
    expected_none = (2 * math.log(4 / 3) + math.log(4)) / 3
    got = smile_loss(logits_for(labels), labels, SmileConfig(subset="sequence", first_token="none"))
    assert got.item() == pytest.approx(expected_none, abs=1e-6)
    # first_token=mle: the first position uses the full vocabulary, p(2) = 3/15 -> log 5
    expected_mle = (math.log(5) + math.log(4) + math.log(4 / 3)) / 3
    got = smile_loss(logits_for(labels), labels, SmileConfig(subset="sequence", first_token="mle"))
    assert got.item() == pytest.approx(expected_mle, abs=1e-6)


def test_reverse_subset_hand_computed():
    labels = torch.tensor([[2, 0]])  # V_D = {0, 2}; complement {1, 3, 4} (exps 2, 4, 5)
    # t0: {1,3,4} + label 2 -> 3 / (2+4+5+3) = 3/14 ; t1: {1,3,4} + label 0 -> 1 / (2+4+5+1) = 1/12
    expected = (math.log(14 / 3) + math.log(12)) / 2
    got = smile_loss(logits_for(labels), labels, SmileConfig(subset="reverse", first_token="none"))
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_padding_does_not_enter_the_sequence_subset():
    # Id 0 is the placeholder the padding's -100 is read as; it is not in this caption, so V_D = {2, 3} (exps 3, 4):
    # t0: p(2) = 3/7, t1: p(3) = 4/7 -> mean(log 7/3, log 7/4). Were the padding counted, V_D = {0, 2, 3} (sum 8).
    labels = torch.tensor([[2, 3, -100]])
    expected = (math.log(7 / 3) + math.log(7 / 4)) / 2
    got = smile_loss(logits_for(labels), labels, SmileConfig(subset="sequence", first_token="none"))
    assert got.item() == pytest.approx(expected, abs=1e-6)
    mask = subset_mask(labels, 5, SmileConfig(subset="sequence"))
    assert mask[0, 0].tolist() == [False, False, True, True, False]
    assert mask[0, 2].all()  # the ignored position: a full row (its loss is dropped)


def test_reverse_subset_without_eos_in_v_d_hand_computed():
    # labels [2, EOS=4]. include_eos=True: V_D = {2, 4}, complement {0, 1, 3} (exps 1, 2, 4: sum 7);
    # t0: + label 2 -> 3/10 ; t1: + label 4 -> 5/12.
    # include_eos=False: V_D = {2}, so EOS joins the complement {0, 1, 3, 4} (sum 12) at every position;
    # t0: + label 2 -> 3/15 ; t1: 4 already in it -> 5/12.
    labels = torch.tensor([[2, 4]])
    kw = {"subset": "reverse", "first_token": "none"}
    got = smile_loss(logits_for(labels), labels, SmileConfig(include_eos=True, **kw), eos_token_id=4).item()
    assert got == pytest.approx((math.log(10 / 3) + math.log(12 / 5)) / 2, abs=1e-6)
    got = smile_loss(logits_for(labels), labels, SmileConfig(include_eos=False, **kw), eos_token_id=4).item()
    assert got == pytest.approx((math.log(15 / 3) + math.log(12 / 5)) / 2, abs=1e-6)


def test_gradients_outside_subset_are_exactly_zero():
    labels = torch.tensor([[2, 0, 2, -100], [4, 4, 1, 3]])
    logits = torch.randn(2, 4, 5, requires_grad=True)
    smile_loss(logits, labels, SmileConfig(subset="sequence", first_token="none")).backward()
    g = logits.grad
    # row 0: V_D = {0, 2}; ids 1, 3, 4 get no gradient at any position
    assert torch.equal(g[0, :, [1, 3, 4]], torch.zeros(4, 3))
    assert torch.equal(g[0, 3], torch.zeros(5))  # ignored position
    # row 1: V_D = {1, 3, 4}; id 0 and 2 get none
    assert torch.equal(g[1, :, [0, 2]], torch.zeros(4, 2))
    assert g[0, 0, [0, 2]].abs().min() > 0 and g[1, 0, [1, 3, 4]].abs().min() > 0


def test_first_token_mle_gives_full_gradient_at_first_position_only():
    labels = torch.tensor([[2, 0, 2]])
    logits = torch.randn(1, 3, 5, requires_grad=True)
    smile_loss(logits, labels, SmileConfig(subset="sequence", first_token="mle")).backward()
    assert logits.grad[0, 0].abs().min() > 0  # every id takes part at t=0
    assert torch.equal(logits.grad[0, 1:, [1, 3, 4]], torch.zeros(2, 3))


def test_first_token_shift_hand_computed():
    labels = torch.tensor([[2, 0]])
    # the first label becomes 4; subset from the shifted labels = {4, 0} (exps 5, 1)
    # t0: p(4) = 5/6 -> log 6/5 ; t1: p(0) = 1/6 -> log 6
    expected = (math.log(6 / 5) + math.log(6)) / 2
    got = smile_loss(logits_for(labels), labels, SmileConfig(subset="sequence", first_token="shift", shift_token_id=4))
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # the MLE term (smile.mle_weight) scores the labels given, not the shifted ones: -log p(2) - log p(0) over the
    # full vocabulary (sum 15): (log 15/3 + log 15/1) / 2 (the shifted 4 would give (log 15/5 + log 15) / 2)
    mle_only = SmileConfig(subset="sequence", first_token="shift", shift_token_id=4, mle_weight=1.0)
    assert smile_loss(logits_for(labels), labels, mle_only).item() == pytest.approx(
        (math.log(15 / 3) + math.log(15)) / 2, abs=1e-6)  # fmt: skip
    with pytest.raises(ConfigError, match="smile.shift_token_id: must be set when smile.first_token=shift"):
        SmileConfig(first_token="shift")


def test_first_token_is_first_non_ignored_label():
    left_padded = torch.tensor([[-100, 2, 0, 2]])
    right_padded = torch.tensor([[2, 0, 2, -100]])
    a = smile_loss(logits_for(left_padded), left_padded, SmileConfig(first_token="mle"))
    b = smile_loss(logits_for(right_padded), right_padded, SmileConfig(first_token="mle"))
    assert a.item() == pytest.approx(b.item(), abs=1e-6)


def test_mle_weight_mixes_linearly():
    labels = torch.tensor([[2, 0, 2]])
    full = (math.log(15 / 3) + math.log(15) + math.log(15 / 3)) / 3  # MLE over all five ids
    smile = (2 * math.log(4 / 3) + math.log(4)) / 3  # as in the sequence test, first_token=none
    for lam in (0.0, 0.25, 1.0):
        got = smile_loss(logits_for(labels), labels, SmileConfig(first_token="none", mle_weight=lam))
        assert got.item() == pytest.approx(lam * full + (1 - lam) * smile, abs=1e-6)


def test_include_eos_option():
    labels = torch.tensor([[2, 4]])  # 4 is EOS; V_D = {2, 4} (exps 3, 5)
    with_eos = (math.log(8 / 3) + math.log(8 / 5)) / 2
    without_eos = (0.0 + math.log(8 / 5)) / 2  # t0: subset {2} -> p = 1; t1: {2} + label 4 -> 5/8
    kw = {"subset": "sequence", "first_token": "none"}
    got = smile_loss(logits_for(labels), labels, SmileConfig(include_eos=True, **kw), eos_token_id=4).item()
    assert got == pytest.approx(with_eos, abs=1e-6)
    got = smile_loss(logits_for(labels), labels, SmileConfig(include_eos=False, **kw), eos_token_id=4).item()
    assert got == pytest.approx(without_eos, abs=1e-6)


def test_random_mode_uses_its_random_subset_not_the_sequence_mask():
    # With k = V the random subset is the whole vocabulary, so the loss must equal full cross-entropy; the bug in
    # the released code (sequence mask applied in random mode) would give 0 here, since V_D = {0}.
    labels = torch.tensor([[0, 0]])
    got = smile_loss(logits_for(labels), labels, SmileConfig(subset="random", random_k=5, first_token="none"))
    assert got.item() == pytest.approx(math.log(15), abs=1e-6)
    assert smile_loss(logits_for(labels), labels, SmileConfig(subset="sequence", first_token="none")).item() == 0.0


def test_random_mask_is_k_ids_plus_label_redrawn_per_sequence():
    V, k = 1000, 10
    labels = torch.tensor([[5, 6, 7], [5, 6, 7]])
    mask = subset_mask(labels, V, SmileConfig(subset="random", random_k=k), draws=torch.Generator().manual_seed(0))
    for b in range(2):
        random_ids = mask[b, 0] & mask[b, 1] & mask[b, 2]  # shared by every position of the sequence
        assert int(random_ids.sum()) == k  # exactly the k random ids (a label is only in its own position)
        for t, lab in enumerate([5, 6, 7]):
            assert mask[b, t, lab]
            assert int(mask[b, t].sum()) in (k, k + 1)
    assert not torch.equal(mask[0], mask[1])  # redrawn per sequence


def test_random_subsets_are_uniform_over_the_whole_vocabulary():
    # random_k ids drawn uniformly without replacement from all V ids: over many captions (each its own seed, as in
    # training) every id is drawn k/V of the time, here 5/20 = 0.25 (binomial sd over 4000 draws: 0.007).
    V, k, n = 20, 5, 4000
    labels = torch.zeros(n, 1, dtype=torch.long)  # one position each, label 0: the subset is the k ids plus id 0
    mask = subset_mask(labels, V, SmileConfig(subset="random", random_k=k), draws=torch.arange(n))[:, 0]  # (n, V)
    assert mask[:, 0].all()  # the label is always in its own subset
    assert torch.all((mask[:, 1:].float().mean(dim=0) - k / V).abs() < 0.03)  # ids 1 .. V-1: drawn k/V of the time
    sizes = mask.sum(dim=1)  # k distinct ids, plus the label when they missed it
    assert torch.all((sizes == k) | (sizes == k + 1)) and (sizes == k).any() and (sizes == k + 1).any()


def test_invalid_options_name_the_option():
    # the options are the smile section's: refused when it is built, as when read from a recipe
    with pytest.raises(
        ConfigError, match="smile.subset: invalid value 'complement'; valid choices: sequence, reverse"
    ):
        SmileConfig(subset="complement")
    with pytest.raises(ConfigError, match="smile.first_token"):
        SmileConfig(first_token="first")
    with pytest.raises(ConfigError, match=r"smile.mle_weight: must be in \[0, 1\], got 1.5"):
        SmileConfig(mle_weight=1.5)


def test_objective_state_roundtrip_continues_random_draws():
    from finecap.objectives.smile import SmileObjective

    a = SmileObjective(SmileConfig(subset="random"), seed=3)
    torch.rand(5, generator=a._generator)  # advance
    state = a.state_dict()
    b = SmileObjective(SmileConfig(subset="random"), seed=99)
    b.load_state_dict(state)
    assert torch.equal(torch.rand(4, generator=a._generator), torch.rand(4, generator=b._generator))


class RecordingLM(torch.nn.Module):
    """Returns the fixed logits of :data:`Z` for every position and keeps the batch it was given."""

    def __init__(self):
        super().__init__()
        self.tokenizer = type("Tok", (), {"eos_token_id": 0})()
        self.seen = []

    def forward(self, batch):
        self.seen.append({k: v.clone() for k, v in batch.items()})
        return logits_for(batch["labels"])


def test_objective_shifts_the_first_token_of_input_and_label():
    """SMILE's first-token shifting as the released code makes it: the first caption token becomes the shift token
    in the teacher-forced input too, so the model reads, after the shift token, what it will read at inference after
    emitting it; the batch given is left as it was."""
    from finecap.objectives.smile import SmileObjective

    ids = torch.tensor([[3, 1, 0, 0], [1, 3, 1, 0]])
    labels = torch.tensor([[3, 1, 0, -100], [1, 3, 1, 0]])
    batch = {"input_ids": ids.clone(), "labels": labels.clone()}
    model = RecordingLM()
    out = SmileObjective(SmileConfig(subset="sequence", first_token="shift", shift_token_id=2))(model, batch)
    assert model.seen[0]["input_ids"].tolist() == [[2, 1, 0, 0], [2, 3, 1, 0]]
    assert model.seen[0]["labels"].tolist() == [[2, 1, 0, -100], [2, 3, 1, 0]]
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["labels"], labels)
    # the loss is smile_loss of the shifted labels: row 0 subset {2, 1, 0} (exps 3, 2, 1), row 1 {2, 3, 1, 0}
    # row 0: -log 3/6, -log 2/6, -log 1/6; row 1: -log 3/10, -log 4/10, -log 2/10, -log 1/10
    expected = (math.log(2) + math.log(3) + math.log(6) + math.log(10 / 3) + math.log(10 / 4) + math.log(5)
                + math.log(10)) / 7  # fmt: skip
    assert out.losses["smile"].item() == pytest.approx(expected, abs=1e-6)
    # first-token MLE and no restriction feed the caption as it is
    model = RecordingLM()
    SmileObjective(SmileConfig(first_token="mle"))(model, batch)
    assert torch.equal(model.seen[0]["input_ids"], ids)


def test_subword_shift_moves_each_first_token_to_its_own_sub_word_form():
    """SMILE Sec. 3.3 shifts the first token to *its* alternative ("a" to "##a"; the released code: '##' + token).
    finecap could only put one id first in every caption, so "two ..." became "##a ..." and lost its first word;
    smile.shift_form=subword shifts each to its own form, the unknown token where the vocabulary has none, as
    convert_tokens_to_ids makes it in the released code."""
    from finecap.models.first_token import subword_alternatives
    from finecap.models.tokenizer import world_tokenizer
    from finecap.objectives.smile import SmileObjective, shift_first_tokens

    tok = world_tokenizer(["a", "two", "cat", "##a", "##two"])  # <unk> 1, <eos> 4; ids 5 .. 9
    vocab = tok.get_vocab()
    a, two, cat, sub_a, sub_two = (vocab[w] for w in ("a", "two", "cat", "##a", "##two"))
    table = subword_alternatives(tok)
    assert (table[a], table[two], table[cat], table[sub_a]) == (sub_a, sub_two, tok.unk_token_id, sub_a)

    class Captioner(torch.nn.Module):  # uniform logits over the 10 ids; keeps the batch it was given
        def __init__(self):
            super().__init__()
            self.tokenizer, self.seen = tok, []

        def forward(self, batch):
            self.seen.append(batch["input_ids"].clone())
            return torch.zeros(*batch["labels"].shape, 10)  # (B, T, V)

    ids = torch.tensor([[two, cat, 4], [a, cat, 4], [cat, a, 4]])  # "two cat", "a cat", "cat a"
    model = Captioner()
    smile = SmileConfig(subset="sequence", first_token="shift", shift_form="subword")
    out = SmileObjective(smile)(model, {"input_ids": ids, "labels": ids.clone()})
    assert model.seen[0][:, 0].tolist() == [sub_two, sub_a, tok.unk_token_id]
    assert model.seen[0][:, 1:].tolist() == ids[:, 1:].tolist()
    # uniform logits: each position costs log |V_D| of the shifted caption, 3 distinct ids in every row: log 3
    assert out.losses["smile"].item() == pytest.approx(math.log(3), abs=1e-6)
    from finecap.config import Config, TrainConfig
    from finecap.objectives.smile import validation_shift_token

    cfg = Config(train=TrainConfig(objective="smile"), smile=smile)  # the validation loss shifts as training does
    assert torch.equal(validation_shift_token(cfg, model), table)
    shifted = shift_first_tokens({"input_ids": ids, "labels": ids}, table)  # shifting twice changes nothing
    assert torch.equal(shift_first_tokens(shifted, table)["labels"], shifted["labels"])
    # the options name themselves: one id, or each token's form, not both; no sub-word forms, no subword shift
    with pytest.raises(ConfigError, match="smile.shift_token_id: must be unset with smile.shift_form=subword"):
        SmileConfig(first_token="shift", shift_form="subword", shift_token_id=2)
    with pytest.raises(ValueError, match="smile.shift_form=subword: the tokenizer .* has no '##' sub-word forms"):
        subword_alternatives(world_tokenizer(["a", "two"]))


def test_in_training_a_captions_random_subset_depends_on_its_index_not_on_the_batch_it_is_in(monkeypatch):
    """Each process drew its micro-batch's subsets from a generator seeded by run.seed alone: row j of every process
    got the same ids (2 processes did not equal 1). Seeded by (seed, step, index), a caption's subset is its own."""
    import finecap.objectives.smile as smile_module
    from finecap.contract import StepInfo

    labels = torch.tensor([[1, 2, -100], [3, 1, 2], [2, 2, 1], [4, 0, -100]])
    masks = []
    real = smile_module.subset_mask
    monkeypatch.setattr(smile_module, "subset_mask", lambda *a, **kw: masks.append(real(*a, **kw)) or masks[-1])

    def subsets(index, step):
        obj = smile_module.SmileObjective(SmileConfig(subset="random", random_k=3, first_token="none"), seed=7)
        model = RecordingLM()
        model.forward = lambda batch: logits_for(batch["labels"])  # the step info is no tensor to record
        obj(model, {"input_ids": labels[index], "labels": labels[index], "index": torch.tensor(index),
                    "step_info": StepInfo(step=step, image_ids=index)})  # fmt: skip
        return {i: masks[-1][row, 0] for row, i in enumerate(index)}  # (V,) the subset at each caption's first token

    whole, halves = subsets([0, 1, 2, 3], 5), {**subsets([0, 1], 5), **subsets([2, 3], 5)}
    assert all(torch.equal(whole[i], halves[i]) for i in range(4))
    assert not torch.equal(whole[0], whole[2])  # two rows of one batch draw apart
    later = subsets([0, 1, 2, 3], 6)
    assert any(not torch.equal(whole[i], later[i]) for i in range(4))  # and each step draws anew


class _Val(list):
    """Validation examples: what the training loop's evaluation reads of a data set."""

    features = None


class _Accelerator:
    """One process on the CPU: what :func:`finecap.train.validators.validation_loss` reads of an accelerator."""

    process_index, num_processes, device = 0, 1, torch.device("cpu")

    def autocast(self):
        import contextlib

        return contextlib.nullcontext()

    def reduce(self, t, reduction="sum"):
        return t


class _Recorder(torch.nn.Module):
    """A captioner whose logits put all mass on token 5 at every position; records the batches it scores."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, batch):
        self.seen.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        B, T = batch["labels"].shape
        return torch.full((B, T, 7), -30.0).index_fill_(2, torch.tensor([5]), 0.0)


@pytest.mark.parametrize("first_token", ["shift", "mle"])
def test_validation_loss_scores_the_captions_as_the_model_is_trained_to_emit_them(first_token):
    # The training loop's validation `loss` (train.best_metric=loss) scored SMILE-shifted models on unshifted
    # captions: their first label a word the model is trained not to emit, every later token after a context it never
    # read. It scores the shifted captions now (input and label), as SmileObjective trains them.
    from types import SimpleNamespace

    from finecap.config import Config, TrainConfig
    from finecap.train.run import make_evaluate

    items = _Val([torch.tensor([1, 2, 3]), torch.tensor([4, 2, 6])])

    def collate(rows):
        ids = torch.stack(rows)
        return {"input_ids": ids, "labels": ids.clone()}

    shift = 5 if first_token == "shift" else None
    cfg = Config(train=TrainConfig(objective="smile", log_captions=0),
                 smile=SmileConfig(first_token=first_token, shift_token_id=shift))  # fmt: skip
    model = _Recorder()
    values = make_evaluate(cfg, SimpleNamespace(val=items, collator=collate), [], _Accelerator())(model)
    (seen,) = model.seen
    firsts = [5, 5] if first_token == "shift" else [1, 4]
    assert seen["input_ids"][:, 0].tolist() == firsts and seen["labels"][:, 0].tolist() == firsts
    assert seen["labels"][:, 1:].tolist() == [[2, 3], [2, 6]]  # the rest of each caption is as it was
    if first_token == "shift":  # the shift token has probability ~1: only the 4 later labels cost 30 nats each
        assert values["loss"] == pytest.approx(4 * 30.0 / 6, rel=1e-4)


def test_a_subword_shifted_captioners_first_token_is_written_as_its_word():
    """A captioner trained with smile.shift_form=subword starts its captions with a '##' form, which the tokenizer
    writes as it is ("##a dog", as BERT's does); finecap writes the word it was shifted from ("a dog"), through
    greedy decoding and beam search alike, and leaves out the unknown token that stood for words without a form."""
    from finecap.config import Config, DecodeConfig, TrainConfig
    from finecap.decode import Generation, decode, texts_of
    from finecap.models.first_token import unshift_first_tokens
    from finecap.models.tokenizer import world_tokenizer

    tok = world_tokenizer(["a", "two", "dog", "##a", "##two"])  # <unk> 1, <eos> 4; ids 5 .. 9
    a, two, dog, sub_a, sub_two = (tok.convert_tokens_to_ids(w) for w in ("a", "two", "dog", "##a", "##two"))
    cfg = Config(train=TrainConfig(objective="smile"), smile=SmileConfig(first_token="shift", shift_form="subword"))
    first = unshift_first_tokens(cfg, tok)
    assert first == {sub_a: a, sub_two: two, tok.unk_token_id: None}
    # "dog" has no "##dog": shifted to <unk>, which is left out; "##a" later in a caption stays as it is
    seqs = torch.tensor([[sub_a, dog, 4], [sub_two, dog, 4], [tok.unk_token_id, dog, 4], [dog, sub_a, 4]])
    gen = Generation(seqs, torch.zeros(4, 3), torch.tensor([3, 3, 3, 3]), torch.arange(4), torch.zeros(4))
    assert texts_of(tok, gen) == ["##a dog", "##two dog", "dog", "doga"]  # as the tokenizer writes them
    assert texts_of(tok, gen, first) == ["a dog", "two dog", "dog", "doga"]
    # the other runs write their captions as decoded
    assert unshift_first_tokens(Config(train=TrainConfig(objective="smile")), tok) is None
    assert unshift_first_tokens(Config(smile=SmileConfig(first_token="shift", shift_form="subword")), tok) is None

    class Stepper:  # "##a" first, then "dog", then <eos>, whatever the image
        def start(self, features):
            return self.logits([()] * len(features)), [()] * len(features)

        def step(self, tokens, state):
            state = [h + (int(t),) for h, t in zip(state, tokens, strict=True)]
            return self.logits(state), state

        def select(self, state, index):
            return [state[i] for i in index.tolist()]

        def logits(self, state):
            out = torch.full((len(state), len(tok)), -5.0)  # (N, V)
            for row, history in enumerate(state):
                out[row, [sub_a, dog, 4][min(len(history), 2)]] = 5.0
            return out

    for strategy in ("greedy", "beam"):
        settings = DecodeConfig(strategy=strategy, beam_size=2, max_length=5)
        gen = decode(Stepper(), torch.zeros(2, 1), settings, tok, first_tokens=first)
        assert gen.sequences[:, 0].tolist() == [sub_a, sub_a] and gen.texts == ["a dog", "a dog"], strategy
