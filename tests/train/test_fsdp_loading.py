"""Loading without copies under ``train.strategy=fsdp`` (issue 65): in 2 gloo processes only the main one reads the
checkpoint; the other builds the VLM on the meta device and, once sharded, holds exactly the main process's weights
(every parameter gathered equal bit for bit, the rotary buffers no state dict holds equal too, tied embeddings still
one parameter), with LoRA adapters over a bfloat16 base (two dtypes, random adapters that differ per process until the
main one's arrive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.models.presets import tiny_vlm
from helpers.launch import launch_bounded

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


@pytest.mark.parametrize("overrides", [["model.dtype=bfloat16", "lora.lm=true", "lora.rank=4", "lora.alpha=8"], []],
                         ids=["bf16+lora", "fp32"])  # fmt: skip
def test_only_the_main_process_reads_the_weights_and_every_shard_equals_them(tmp_path, launch_two, overrides):
    folder = save_tied_qwen2_vl(tmp_path / "vlm")
    worker = Path(__file__).with_name("load_worker.py")
    launch_bounded([*launch_two, str(worker), str(folder), str(tmp_path), json.dumps(overrides)],
                   tmp_path / "log.txt", timeout=300)  # fmt: skip
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert main["devices"] == ["cpu"]
    assert other["devices"] == ["meta"]  # LoRA adapters too: peft puts them on their base layer's device
    for record in (main, other):
        assert record["layers"] > 0 and record["sharded"] > 0
        assert record["equal"] and all(record["equal"].values()), [k for k, v in record["equal"].items() if not v]
        assert record["buffers_equal"] and all(record["buffers_equal"].values())
        assert record["tied"]
