"""The model card asks the backbone's class what the folder was built on and how other tools load it
(``base_models`` / ``card_lines`` of :class:`finecap.models.base.CaptionerBase`): the lines of each registered
backbone, from hand-written ``captioner.json`` contents."""

from __future__ import annotations

import pytest

from finecap.config import from_dict
from finecap.train.model_card import model_card

HUB_BLIP, HUB_VLM = "Salesforce/blip-image-captioning-base", "HuggingFaceTB/SmolVLM-256M-Instruct"
CLIP = "openai/clip-vit-base-patch32"
BLIP_CLASS = "BlipForConditionalGeneration"
PEFT_BLIP = ("`adapter/` is one peft LoRA adapter for the whole model: "
             f'`PeftModel.from_pretrained({BLIP_CLASS}.from_pretrained(base), "adapter")`.')  # fmt: skip


def card(meta: dict) -> list[str]:
    return model_card(from_dict({"run": {"name": "r"}}), {"step": 1}, meta, None, "finecap train").split("\n")


def loading(lines: list[str]) -> list[str]:
    """The lines of the "Loading" section after finecap's own code block, up to the next section."""
    start = lines.index("## Loading")
    end = lines.index("## Made by")
    block_end = lines.index("```", lines.index("```python", start) + 1)
    return [line for line in lines[block_end + 1 : end] if line]


@pytest.mark.parametrize(
    ("meta", "bases", "hub", "extra"),
    [
        ({"kind": "clipcap", "lm_source": "gpt2", "encoder_source": CLIP},
         {"language model": "gpt2", "vision encoder": CLIP}, [CLIP],
         ["`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features to its prefix "
          "(finecap's `ClipCap` reads both)."]),
        ({"lm_source": "world-tiny", "encoder_source": "/x/enc"},  # no kind: clipcap
         {"language model": "world-tiny", "vision encoder": "/x/enc"}, [],
         ["`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features to its prefix "
          "(finecap's `ClipCap` reads both)."]),
        ({"kind": "blip", "source": HUB_BLIP, "adapter": "adapter", "lora": {"lm": {}}}, {"model": HUB_BLIP},
         [HUB_BLIP],
         [f"The folder is also a plain transformers checkpoint (`{BLIP_CLASS}.from_pretrained(folder)`, "
          "base weights without adapters).", PEFT_BLIP]),
        ({"kind": "blip", "source": "world-tiny", "world_source": "/x/enc"},  # reads a dual encoder: finecap's only
         {"model": "world-tiny", "vision encoder": "/x/enc"}, [], []),
        ({"kind": "vlm", "source": HUB_VLM}, {"model": HUB_VLM}, [HUB_VLM],
         ["The folder is also a plain transformers checkpoint (`AutoModelForImageTextToText.from_pretrained(folder)`, "
          "base weights without adapters)."]),
        ({"kind": "vlm", "source": "world-tiny", "world_source": "/x/enc", "adapter": "adapter"},
         {"model": "world-tiny", "vision encoder": "/x/enc"}, [], []),
    ],
    ids=["clipcap", "clipcap-no-kind", "blip-adapter", "blip-world", "vlm", "vlm-world"],
)  # fmt: skip
def test_the_card_asks_the_backbone(meta, bases, hub, extra):
    lines = card(meta)
    assert [line for line in lines if line.startswith("- **Base ")] == [
        f"- **Base {role}**: `{source}`" for role, source in bases.items()
    ]
    assert [line for line in lines if line.startswith("base_model:")] == ([f'base_model: ["{hub[0]}"]'] if hub else [])
    assert f"- **Backbone**: `{meta.get('kind', 'clipcap')}`" in lines
    assert loading(lines) == extra


def test_an_unknown_kind_names_the_file():
    with pytest.raises(
        ValueError, match=r"^captioner.json: unknown captioner kind 'nope'; valid names: blip, clipcap"
    ):
        card({"kind": "nope"})
