"""``finecap train ... --dry-run`` (issue 49, item 6): the resolved configuration, the parameters by part, role and
dtype, a memory estimate of weights and training state, and one training step's loss, time and peak memory; the run
directory stays empty and no checkpoint is saved."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

from finecap.app.cli import main
from finecap.models.memory import parameter_counts, training_memory

WORLD = ("world.n_train=20", "world.n_val=4", "world.n_test=4", "world.image_size=32")
ENCODER = ("retriever.epochs=1", "retriever.batch_size=8", "retriever.batch_size_eval=16")
CLIPCAP = ("clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
           "train.batch_size=8", "decode.max_length=6")  # fmt: skip


class Two(torch.nn.Module):
    """A captioner-shaped module with an ``lm`` and an ``encoder`` part and one parameter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = torch.nn.Linear(3, 4)  # 12 + 4 = 16 weights, trainable float32
        self.encoder = torch.nn.Linear(2, 2).to(torch.bfloat16).requires_grad_(False)  # 4 + 2 = 6, frozen bf16
        self.scale = torch.nn.Parameter(torch.ones(5))  # 5, trainable float32 (the rest)

    def lora_module(self, part: str) -> torch.nn.Module | None:
        return getattr(self, part, None)


def test_parameter_counts_and_training_memory_by_hand():
    model = Two()
    assert parameter_counts(model) == {"lm": {"trainable": {"float32": 16}}, "encoder": {"frozen": {"bfloat16": 6}},
                                       "rest": {"trainable": {"float32": 5}}}  # fmt: skip
    # weights: 16 x 4 + 6 x 2 + 5 x 4 = 96 bytes; gradients: (16 + 5) x 4 = 84; AdamW: 2 x 84 = 168
    assert training_memory(model) == {"weights": 96, "gradients": 84, "optimizer": 168, "total": 348}
    # sharded (FSDP2 over 2 processes: a DTensor's numel is the whole tensor's, its local shard half of it): what this
    # process holds is counted, not the whole model once per process
    for p in model.parameters():
        p.to_local = lambda p=p: p.detach().flatten()[: p.numel() // 2]  # a stand-in for DTensor.to_local()
    # local: 8 x 4 + 3 x 2 + 2 x 4 = 46 bytes of weights; gradients (8 + 2) x 4 = 40; AdamW 80
    assert training_memory(model) == {"weights": 46, "gradients": 40, "optimizer": 80, "total": 166}


@pytest.mark.slow
def test_dry_run_prints_the_report_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", "demo/mle", *WORLD, *ENCODER, *CLIPCAP, f"world.out={tmp_path / 'w'}", "--out", str(run),
                     "--dry-run"])  # fmt: skip
    assert code == 0, err.getvalue()
    text = out.getvalue()
    assert "objective: mle" in text and "tiny_hidden: 32" in text  # the resolved configuration
    assert "dry run: nothing trained or written" in text
    assert "lm       trainable float32" in text and "encoder  frozen" in text
    assert "memory estimate per process (GiB): weights" in text and "optimizer" in text
    line = [x for x in text.splitlines() if x.startswith("one training step on the first batch (8 per process")]
    assert line and "loss" in line[0], text
    assert not run.exists() or not any(run.iterdir())  # no config.yaml, no metrics.jsonl, no checkpoint


def test_the_docs_say_the_dry_run_prints_the_whole_configuration_first():
    # README said --dry-run "prints parameters, a memory forecast and one step's loss": it prints the resolved
    # configuration first, every key (284 lines for own/mle; the test above reads it)
    root = Path(__file__).resolve().parents[2]
    for page in ("README.md", "docs/memory.md"):
        text = " ".join((root / page).read_text().split())
        start = text.index("`--dry-run` prints")
        said = text[start : text.index(".", start)]
        assert "whole resolved configuration" in said and "every key" in said, (page, said)


def test_dry_run_does_not_resume():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", "demo/mle", "--dry-run", "--resume"])
    assert code == 2 and "--dry-run builds a fresh run" in err.getvalue()


def test_dry_run_of_a_vlm_recipe_prints_the_activation_forecast(tmp_path, monkeypatch):
    """A VLM recipe's dry run (issue 65): the activations forecast from the model's shapes by part, per image and
    per caption, said to be a forecast on the CPU, and the total; the report carries the step's shapes."""
    from helpers.vlm_families import save_family, write_tiny_coco

    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    folder = save_family(tmp_path / "vlm", "idefics3")
    data, images = write_tiny_coco(tmp_path / "coco")
    out, err = io.StringIO(), io.StringIO()
    args = ["train", "coco/grpo_cider_vlm", f"vlm.name={folder}", f"data.path={data}", f"data.images={images}",
            "train.init_from=", "train.batch_size=2", "rl.samples=2", "decode.max_length=6", "data.max_tokens=8",
            "data.num_workers=0", "data.persistent_workers=false", "data.pin_memory=false",
            f"run.dir={tmp_path / 'run'}", f"run.cache_dir={tmp_path / 'cache'}", "--dry-run"]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    assert code == 0, err.getvalue()
    text = out.getvalue()
    line = next(x for x in text.splitlines() if x.startswith("activations (a forecast, not a measurement)"))
    assert "2 images x 2 captions" in line and "caption 6 tokens" in line and "per caption" in line
    assert (
        "forecast total per process (weights, gradients, AdamW, activations):" in text
        and "peak RSS growth (not activations" in text
    )


def test_the_forecast_counts_one_retriever_for_the_components_that_share_it(tmp_path):
    """Session 35's review: the dry run's total left out the frozen retrievers. The self-retrieval reward (on the
    device when training starts) and the retrieval validator (from its first evaluation) share one copy, loaded once
    (tests/train/test_shared_retriever.py: coco/sr_l_vlm has both, one copy; until session 36 each loaded its own);
    coco/smile_vlm's validator alone has one; coco/mle_vlm none. A copy is the loaded model's storage (measured here
    on a tiny CLIP)."""
    from types import SimpleNamespace

    from finecap.config import load
    from finecap.models.presets import save_tiny_clip
    from finecap.models.retriever import Retriever
    from finecap.train.run import kept_beside

    clip = save_tiny_clip(tmp_path / "clip")
    model = Retriever.from_pretrained(clip).model
    one = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    reward = SimpleNamespace(needs=frozenset({"retriever"}))  # what the objective of a retrieval reward declares
    for recipe, objective, copies in (("sr_l_vlm", reward, 1), ("smile_vlm", SimpleNamespace(), 1),
                                      ("mle_vlm", SimpleNamespace(), 0)):  # fmt: skip
        cfg = load(f"coco/{recipe}", [f"retriever.checkpoint={clip}"])
        assert kept_beside(torch.nn.Linear(2, 2), cfg, objective)["frozen retrievers"] == copies * one, recipe
