"""World encoder: architecture and losses (finecap.models.world_encoder), training, cache (world_encoder_cache) and
probe (finecap.app.retriever), checkpoint contract, on a tiny world."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import TextIO

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from finecap.app import retriever as ar
from finecap.config import Config, load
from finecap.models import world_encoder as we
from finecap.models import world_encoder_cache as wc
from finecap.models.retriever import Retriever
from finecap.models.tokenizer import world_tokenizer
from finecap.train import world_encoder as tw  # training the world encoder is the library's (finecap train, serve)
from finecap.world.make import make_world
from finecap.world.scene import Obj, Scene
from helpers.waiting import SAYS_WAITING

TINY = ["world.n_train=24", "world.n_val=8", "world.n_test=12", "world.image_size=32", "retriever.epochs=2",
        "retriever.batch_size=8", "retriever.batch_size_eval=16"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("we")
    cfg = load(None, [*TINY, f"world.out={root / 'world'}", f"run.cache_dir={root / 'cache'}"])
    make_world(cfg.world, progress=False)
    with pytest.raises(FileNotFoundError, match="finecap retriever train"):
        wc.world_encoder_path(cfg)  # looking up never trains
    path = ar.ensure_world_encoder(cfg, progress=False)
    return cfg, path


def test_build_world_model_final_map_is_1x1_and_projects():
    torch.manual_seed(0)
    model = we.build_world_model(world_tokenizer(), 32)
    assert isinstance(model, transformers.VisionTextDualEncoderModel)
    assert model.config.vision_config.patch_size == 4  # 32 / 2**3, so 4 -> 2 -> 1 after three halvings
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model.vision_model(pixel_values=x)
        assert out.last_hidden_state.shape[-2:] == (1, 1)  # no average pooling over a larger map
        feats = model.get_image_features(pixel_values=x).pooler_output
    assert feats.shape == (2, 256)
    assert model.config.text_config.eos_token_id == 4


def test_build_world_model_rejects_bad_image_size():
    with pytest.raises(ValueError, match="world.image_size=30"):
        we.build_world_model(world_tokenizer(), 30)


def test_image_processor_is_identity_resize_for_world_sized_images():
    proc = we.world_image_processor(8, [0.5, 0.25, 0.0], [0.5, 0.25, 1.0])
    a = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    pv = proc(images=[Image.fromarray(a)], return_tensors="pt")["pixel_values"][0]
    want = (torch.tensor(a).permute(2, 0, 1).float() / 255 - torch.tensor([0.5, 0.25, 0.0])[:, None, None]) / \
        torch.tensor([0.5, 0.25, 1.0])[:, None, None]  # fmt: skip
    assert torch.allclose(pv, want, atol=1e-5)


def test_contrastive_loss_hand_computed():
    eye = torch.eye(2)
    # logits = [[1, 0], [0, 1]]: each row CE = -log(e / (e + 1)) = log(1 + e^-1); both directions equal.
    want = math.log(1 + math.exp(-1))
    got = we.contrastive_loss(eye, eye, torch.tensor([0, 1]), torch.tensor(1.0))
    assert got.item() == pytest.approx(want, rel=1e-6)
    # One text (= image 1) against both images: t2i CE = log(1 + e^-1); i2t over the single targeted image = 0.
    got = we.contrastive_loss(eye[1:], eye, torch.tensor([1]), torch.tensor(1.0))
    assert got.item() == pytest.approx(want / 2, rel=1e-6)


def test_aux_heads_uniform_logits_give_log_class_counts():
    heads = we.AuxHeads(4, main_sizes=[2, 3], cell_sizes=[2], cells=2)
    for p in heads.parameters():
        torch.nn.init.zeros_(p)
    loss = heads(torch.randn(5, 4), torch.zeros(5, 2, dtype=torch.long), torch.ones(5, 2, 1, dtype=torch.long))
    # Three cross-entropies of uniform predictions: log 2, log 3, log 2 -> mean.
    assert loss.item() == pytest.approx((2 * math.log(2) + math.log(3)) / 3, rel=1e-6)


def test_linear_probe_separable():
    x = torch.tensor([[0.0, 1.0], [0.1, 0.9], [1.0, 0.0], [0.9, 0.2]])
    y = torch.tensor([0, 0, 1, 1])
    train_acc, pred = ar.linear_probe(x, y, torch.tensor([[0.0, 2.0], [2.0, 0.0]]), 2)
    assert train_acc == 1.0
    assert pred.tolist() == [0, 1]


def test_retrieval_ceiling_counts_consistent_distractors():
    red = Scene(0, "grass", [Obj("circle", "red", "large", 0, 0)])
    red2 = Scene(1, "sand", [Obj("circle", "red", "small", 1, 1)])
    blue = Scene(2, "grass", [Obj("square", "blue", "large", 0, 0)])
    # "a red circle" fits scenes 0 and 1: with both others as distractors the oracle picks 1 of 2 -> 0.5.
    # "a blue square" fits only scene 2 -> 1.0.
    got = ar.retrieval_ceiling(["a red circle", "a blue square"], np.array([0, 2]), [red, red2, blue], 2, 1, 0)
    assert got == pytest.approx(0.75)


def test_training_reduces_loss_and_changes_weights(tiny):
    cfg, _ = tiny
    data = we.load_split(cfg.world.out, "train", progress=False)
    data = we.WorldData(data.ids[:8], data.images[:8], data.refs[:8], data.dense[:8], data.main[:8], data.cell[:8])
    c = load(None, [*TINY, "retriever.epochs=25", "retriever.lr=3e-3"])
    torch.manual_seed(0)
    model = we.build_world_model(world_tokenizer(), 32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mean, std = torch.full((3,), 0.5), torch.full((3,), 0.25)
    stats = tw.train_dual_encoder(model, world_tokenizer(), data, mean, std, c, progress=False)
    assert stats["steps"] == 25
    assert stats["loss"] < 0.5 * stats["first_loss"]
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("vision_model" in k for k in changed) and any("text_model" in k for k in changed)
    assert "logit_scale" in changed


def test_world_encoder_checkpoint_contract(tiny):
    cfg, path = tiny
    assert path.parent.name == wc.CACHE_SUBDIR and path.name == wc.encoder_key(cfg)
    info = json.loads((path / "encoder.json").read_text())
    assert set(info["in_batch_accuracy"]) == {"ref/text_to_image", "ref/image_to_text", "dense/text_to_image",
                                              "dense/image_to_text"}  # fmt: skip
    # The agreed contract: the class recorded in config.json loads the folder, get_image_features gives features,
    # AutoImageProcessor reads the saved preprocessing.
    arch = transformers.AutoConfig.from_pretrained(path).architectures[0]
    model = getattr(transformers, arch).from_pretrained(path)
    proc = transformers.AutoImageProcessor.from_pretrained(path)
    assert proc.crop_size == {"height": 32, "width": 32}
    image = Image.open(next((Path(cfg.world.out) / "images" / "test").iterdir()))
    pv = proc(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        feats = model.get_image_features(pixel_values=pv).pooler_output
    r = Retriever.from_pretrained(path)
    assert torch.allclose(r.vision_features(pv).detach(), feats, atol=1e-5)
    assert r.embed_texts(["a red circle"]).shape == (1, 256)


def test_world_encoder_reused_from_cache_and_keyed(tiny, monkeypatch):
    cfg, path = tiny

    def boom(*args, **kwargs):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(tw, "train_dual_encoder", boom)
    assert ar.ensure_world_encoder(cfg, progress=False) == path
    assert wc.world_encoder_path(cfg) == path
    base = wc.encoder_key(cfg)
    assert wc.encoder_key(load(None, [*TINY, "retriever.lr=1e-4"])) != base
    assert wc.encoder_key(load(None, [*TINY, "world.seed=3"])) != base
    assert wc.encoder_key(load(None, [*TINY, "run.seed=3"])) != base
    # Evaluation batch size and world.out do not change the trained weights.
    assert wc.encoder_key(load(None, [*TINY, "retriever.batch_size_eval=7"])) == base
    assert wc.encoder_key(load(None, [*TINY, "world.out=elsewhere"])) == base


def test_probe_writes_numbers_and_bar(tiny, tmp_path):
    cfg, path = tiny
    res = ar.probe((path, cfg.world.out), out=tmp_path / "probe.json", progress=False)
    saved = json.loads((tmp_path / "probe.json").read_text())
    assert set(saved["probe"]) == set(we.MAIN_LABELS)
    for v in saved["probe"].values():
        assert 0.0 <= v["test"] <= 1.0
    ret = saved["retrieval"]
    assert ret["n_distractors"] == 11  # min(99, 12 test images - 1)
    assert 0.0 < ret["reference_oracle_R@1"] <= 1.0
    assert set(saved["bar"]["passed"]) == {"probe/shape", "probe/color", "probe/size", "probe/position",
                                           "reference/R@1", "dense/R@1"}  # fmt: skip
    assert res["out"] == str(tmp_path / "probe.json")
    # without --out: beside the retriever, never over a probe.json of the user's there (it was replaced)
    import shutil

    folder = shutil.copytree(path, tmp_path / "my-encoder")  # a retriever folder of the user's
    mine = folder / "probe.json"
    mine.write_text('{"my": "notes"}')
    with pytest.raises(ValueError, match="finecap did not make it"):
        ar.probe((folder, cfg.world.out), progress=False)
    assert mine.read_text() == '{"my": "notes"}'


def test_probe_refuses_an_out_inside_the_world_or_unwritable_before_its_work(tiny, tmp_path, monkeypatch):
    # --out inside the world folder the probe reads was written there (other commands refuse an output inside a
    # folder input), and an --out no file can be written at was found only after the probe's work
    cfg, path = tiny
    world = Path(cfg.world.out)

    def boom(*args, **kwargs):
        raise AssertionError("the probe worked before checking --out")

    monkeypatch.setattr(ar, "read_world", boom)
    monkeypatch.setattr(ar, "ensure_world_encoder", boom)
    inside = world / "probe.json"
    with pytest.raises(ValueError, match=r"--out: .*probe.json lies inside the command's world"):
        ar.probe((path, world), out=inside, progress=False)
    config = load(None, [*TINY, f"world.out={world}", f"run.cache_dir={cfg.run.cache_dir}"])
    with pytest.raises(ValueError, match=r"--out: .*probe.json lies inside the command's world"):
        ar.probe(config, out=inside, progress=False)
    assert not inside.exists()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=r"--out: .*a-file is not a folder"):
        ar.probe((path, world), out=tmp_path / "a-file" / "probe.json", progress=False)
    with pytest.raises(ValueError, match=r"--out: .*a-file is not a folder"):
        ar.probe(config, out=tmp_path / "a-file" / "probe.json", progress=False)


def test_probe_of_a_configuration_reads_captions_as_its_retriever_long_text_says(tiny, tmp_path):
    # retriever.checkpoint: a CLIP whose text window (16 tokens) is shorter than the world's dense captions. The probe
    # loaded it with the default long_text=truncate, so with long_text=error its dense R@1 was silently scored on
    # the first 16 tokens, where every metric and the reward refuse such a caption.
    cfg, _ = tiny
    tok = world_tokenizer()
    torch.manual_seed(0)
    clip = transformers.CLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16))  # fmt: skip
    Retriever(clip, tok, we.world_image_processor(32, [0.5] * 3, [0.25] * 3)).save(tmp_path / "clip")
    overrides = [*TINY, f"world.out={cfg.world.out}", f"run.cache_dir={cfg.run.cache_dir}",
                 f"retriever.checkpoint={tmp_path / 'clip'}"]  # fmt: skip
    with pytest.raises(ValueError, match=r"retriever.long_text=error: .* more than the 16-token text window"):
        ar.probe(load(None, [*overrides, "retriever.long_text=error"]), out=tmp_path / "e.json", progress=False)
    assert not (tmp_path / "e.json").exists()


def test_eval_of_a_world_uses_that_worlds_encoder_without_its_settings_repeated(tiny, tmp_path):
    # `finecap eval --references WORLD --metrics clipscore` looked the encoder up under the configured world (the
    # default 10,000-scene one): it had to be told the references world's world.* settings again
    from finecap.app.eval import main as eval_main
    from finecap.data.references import load_references
    from finecap.data.results import write_results

    cfg, _ = tiny
    world = Path(cfg.world.out)
    refs = load_references(cfg, world, split="test")
    write_results(tmp_path / "r.json", {r.image_id: r.captions[0] for r in refs.records})
    retriever = [o for o in TINY if o.startswith("retriever.")]
    plain = load(None, [*retriever, f"run.cache_dir={cfg.run.cache_dir}"])  # no world.* settings
    out = eval_main(plain, predictions=tmp_path / "r.json", references=world, metrics="clipscore")
    assert 0 < out["CLIPScore"] <= 2.5
    other_seed = load(None, [*retriever, f"run.cache_dir={cfg.run.cache_dir}", "run.seed=5"])
    with pytest.raises(ValueError, match=r"no world encoder of this world is trained with these retriever.\* "
                                         r"settings and run.seed=5"):  # fmt: skip
        eval_main(other_seed, predictions=tmp_path / "r.json", references=world, metrics="clipscore")


# --------------------------------------------------------------------------------------------------------------------
# Two processes needing one world encoder (one home, two terminals or a job array)
# --------------------------------------------------------------------------------------------------------------------

PAUSED_TRAINER = (
    SAYS_WAITING
    + """
import logging, sys
from finecap.config import Config, load
from finecap.train import world_encoder as tw

train = tw.train_dual_encoder

def paused(*args, **kwargs):
    print("training", flush=True)
    sys.stdin.readline()  # the test says when to go on (or kills this process here)
    return train(*args, **kwargs)

tw.train_dual_encoder = paused
print("done", tw.ensure_world_encoder(load(None, sys.argv[1:]), progress=False), flush=True)
"""
)


@dataclasses.dataclass
class _Trainer:
    """A process running :data:`PAUSED_TRAINER` (its ``process``), and this process's ends of its standard input and
    output."""

    process: multiprocessing.Process
    stdin: TextIO
    stdout: TextIO

    def finish(self, line: str = "") -> str:
        """Send ``line``, close its input, and return the rest of its output once it has ended (300 s at most)."""
        self.stdin.write(line)
        self.stdin.close()
        self.process.join(300)
        assert self.process.exitcode is not None, "the process still runs after 300 s"
        with self.stdout:
            return self.stdout.read()

    def kill(self) -> None:
        """Kill it (SIGKILL) if it still runs, and close this process's ends of its pipes."""
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
        self.stdin.close()
        self.stdout.close()


def _run_script(script: str, argv: list[str], stdin: int, stdout: int) -> None:
    sys.stdin, sys.stdout, sys.argv = os.fdopen(stdin), os.fdopen(stdout, "w"), ["-c", *argv]
    exec(script, {"__name__": "__main__"})
    sys.stdout.flush()


def _paused_trainer(settings: list[str]) -> _Trainer:
    """A process asking for the world encoder of ``settings``: prints ``training`` (then waits for a line on its
    stdin) when it starts training, ``waiting`` when it waits for another's lock, ``done PATH`` at the end. Forked
    from this one, whose imports it shares: a fresh interpreter's (``python -c``) were most of these tests' work, and
    the lock, an operating-system lock, is between processes however they started."""
    stdin, stdout = os.pipe(), os.pipe()
    process = multiprocessing.get_context("fork").Process(
        target=_run_script, args=(PAUSED_TRAINER, settings, stdin[0], stdout[1])
    )
    process.start()
    os.close(stdin[0])
    os.close(stdout[1])
    return _Trainer(process, os.fdopen(stdin[1], "w"), os.fdopen(stdout[0]))


def _made_world(tmp_path: Path) -> tuple[list[str], Config]:
    """The settings of a tiny world made under ``tmp_path`` (its encoder not trained yet), and their configuration."""
    settings = [*TINY, f"world.out={tmp_path / 'world'}", f"run.cache_dir={tmp_path / 'cache'}"]
    cfg = load(None, settings)
    make_world(cfg.world, progress=False)
    return settings, cfg


@pytest.mark.slow
def test_two_processes_needing_one_world_encoder_train_it_once(tmp_path):
    # ensure_world_encoder took no lock: a second process trained the same encoder again (minutes of the demo's
    # time) and swapped its folder in under the first while the first went on to load it
    settings, cfg = _made_world(tmp_path)
    first = _paused_trainer(settings)
    second = None
    try:
        assert first.stdout.readline() == "training\n"  # the first trains, paused here
        second = _paused_trainer(settings)
        assert second.stdout.readline() == "waiting\n", "the second process trained the encoder again"
        first_out = first.finish("go\n")
        second_out = second.finish()
    finally:
        for trainer in (first, second):
            if trainer is not None:
                trainer.kill()
    path = wc.encoder_dir(cfg)
    assert first.process.exitcode == 0 and first_out == f"done {path}\n"
    assert second.process.exitcode == 0 and second_out == f"done {path}\n"  # found it made: never trained
    assert json.loads((path / "encoder.json").read_text())["key"] == wc.encoder_key(cfg)
    assert sorted(p.name for p in path.parent.iterdir()) == [f".{path.name}.lock", path.name]


@pytest.mark.slow
def test_a_killed_trainer_of_the_world_encoder_blocks_no_one(tmp_path):
    settings, cfg = _made_world(tmp_path)
    killed = _paused_trainer(settings)
    assert killed.stdout.readline() == "training\n"  # holds the lock
    killed.kill()
    assert killed.process.exitcode == -signal.SIGKILL
    after = _paused_trainer(settings)
    try:
        assert after.stdout.readline() == "training\n"  # the lock died with its holder: no wait
        out = after.finish("go\n")
    finally:
        after.kill()
    assert after.process.exitcode == 0 and out == f"done {wc.encoder_dir(cfg)}\n"
