"""Loading without copies under ``train.strategy=fsdp`` (issue 65): in 2 gloo processes only the main one reads the
checkpoint; the other builds the VLM on the meta device and, once sharded, holds exactly the main process's weights
(every parameter gathered equal bit for bit, the rotary buffers no state dict holds equal too, tied embeddings still
one parameter), with LoRA adapters over a bfloat16 base (two dtypes, random adapters that differ per process until the
main one's arrive), a LLaVA whose trained tower has LoRA adapters only on the layers its image features reach (the
other process, which cannot probe that on the meta device, drops the rest), a BLIP (its tied text embeddings and head
kept in the captioner's group) and a ClipCap whose language model is read from its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.models.presets import build_world_lm, save_tiny_blip, save_tiny_clip, tiny_vlm
from helpers.launch import launch_bounded
from helpers.vlm import save_llava_reading_a_hidden_layer

pytestmark = pytest.mark.skipif(torch.accelerator.is_available(), reason="launches CPU processes on a CPU machine")


def save_tied_qwen2_vl(out: Path) -> Path:
    """A tiny Qwen2-VL whose output head is its input embedding (as Qwen2-VL-2B's), saved like a Hub checkpoint."""
    torch.manual_seed(0)
    model, processor = tiny_vlm("qwen2_vl", layers=2)
    config = model.config
    config.tie_word_embeddings = config.text_config.tie_word_embeddings = True
    generation = model.generation_config
    model = type(model)(config)
    model.generation_config = generation
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


CASES = {
    "vlm-bf16+lora": ("vlm", ["model.dtype=bfloat16", "lora.lm=true", "lora.rank=4", "lora.alpha=8"]),
    "vlm-fp32": ("vlm", []),
    "llava-tower-lora": ("llava", ["model.train_encoder=true", "lora.encoder=true", "lora.rank=4"]),
    "blip": ("blip", []),
    "clipcap": ("clipcap", []),
}
"""Per case: the backbone (a tied tiny Qwen2-VL; a tiny BLIP, whose text embeddings and output head are tied too; a
ClipCap over a tied GPT-2 read from its folder, with a CLIP encoder that every process reads) and the overrides."""


def case_source(backbone: str, root: Path) -> list[str]:
    """The overrides naming the case's checkpoint, saved under ``root``."""
    root.mkdir(parents=True)
    if backbone == "vlm":
        return ["model.kind=vlm", f"vlm.name={save_tied_qwen2_vl(root / 'vlm')}"]
    if backbone == "llava":
        return ["model.kind=vlm", f"vlm.name={save_llava_reading_a_hidden_layer(root / 'llava')}"]
    if backbone == "blip":
        return ["model.kind=blip", f"blip.name={save_tiny_blip(root / 'blip', image_size=32, layers=1)}"]
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    lm.save_pretrained(root / "gpt2")
    tok.save_pretrained(root / "gpt2")
    clip = save_tiny_clip(root / "clip", image_size=16, patch_size=8)
    return [f"clipcap.lm={root / 'gpt2'}", f"model.encoder={clip}", "clipcap.prefix_length=2"]


@pytest.mark.slow
def test_only_the_main_process_reads_the_weights_and_every_shard_equals_them(tmp_path, launch_two):
    # every case in one launch of 2 processes (one process group; a launch costs seconds of imports)
    cases = {
        case: [*case_source(backbone, tmp_path / case), *overrides] for case, (backbone, overrides) in CASES.items()
    }
    worker = Path(__file__).with_name("load_worker.py")
    launch_bounded([*launch_two, str(worker), str(tmp_path), json.dumps(cases)], tmp_path / "log.txt",
                   timeout=300)  # fmt: skip
    for case, (backbone, _) in CASES.items():
        main, other = (json.loads((tmp_path / f"{case}.rank{r}.json").read_text()) for r in (0, 1))
        assert main["devices"] == ["cpu"], case
        # LoRA adapters on the meta device too (peft puts them on their base layer's device); ClipCap's mapper and
        # CLIP encoder are built or read by every process (small), on the CPU
        assert other["devices"] == (["cpu", "meta"] if backbone == "clipcap" else ["meta"]), case
        for record in (main, other):
            assert record["layers"] > 0 and record["sharded"] > 0, case
            assert record["equal"] and all(record["equal"].values()), (case, [k for k, v in record["equal"].items()
                                                                              if not v])  # fmt: skip
            assert all(record["buffers_equal"].values()), case
            if backbone == "llava":  # untied; the tower's adapters only where the features reach, on both processes
                tower = [n for n in record["equal"] if "vision_tower" in n and ".lora_" in n]
                assert tower and not [n for n in tower if ".layers.1." in n], (case, tower)
                assert record["ties"] == main["ties"], case
                continue
            assert record["buffers_equal"], case  # the rotary buffers no state dict holds
            assert record["ties"] and record["ties"] == main["ties"], case  # the tied head is still one parameter
