"""Time finecap's batched greedy and beam-5 decoding against the backbones' own ``generate`` in the same run.

    .venv/bin/python benchmarks/decode.py [--images 64] [--max-length 20] [--repeat 3] [--threads 0] [--json OUT]

Models (random initialisation, the world sizes; random models seldom stop early, so nearly every caption runs to
``--max-length`` tokens and both implementations do about the same work; the script prints how many beam captions
end early):

- ``clipcap``: the world ClipCap (MLP mapper, prefix 10, GPT-2 3 layers x 128 over the world vocabulary) on random
  feature vectors; reference: the mapper, then ``GPT2LMHeadModel.generate(inputs_embeds=prefix, ...)``.
- ``blip``: a ``BlipForConditionalGeneration`` with a 2-layer ViT (width 256, 32 px images, 17 image tokens) and the
  world BLIP's text decoder (3 layers x 128 with cross-attention) on random pixels; reference:
  ``BlipForConditionalGeneration.generate(pixel_values, ...)``. Both run the ViT once per image.
- ``vlm_llava``, ``vlm_idefics3``, ``vlm_qwen2_vl``: a decoder-only VLM of each family (``model.kind=vlm``,
  :func:`finecap.models.presets.tiny_vlm` with a 3-layer x 128 language model, 4 image tokens per 16 px image) on
  random images after the chat prompt; reference: ``generate(**processor outputs, ...)`` on the same model. Both
  run the vision tower once per image and read the prompt's image tokens from the same pre-processed inputs.

Both sides do the same work inside the timing: from the features (ClipCap), pixels (BLIP) or pre-processed prompt
and pixels (VLM) to the caption texts (finecap's ``generate`` returns texts, so the reference timing includes
``tokenizer.batch_decode``).

Settings matched: ``max_new_tokens = --max-length``, ``length_penalty=1``, no sampling, the same EOS/pad ids. Each
timing is the best of ``--repeat`` wall-clock runs (``torch.no_grad``, eval mode), the two sides interleaved run by
run (:mod:`timing`), printed with the range of the rounds' ratios. Beam search is timed with both finishing rules
(``decode.finished_beams``): ``beam5`` is finecap's default ``keep`` (ClipCap's rule), and ``beam5_set_aside`` is
generate's rule, each against its own ``generate`` runs. Greedy and set-aside beam outputs are
checked to be identical to ``generate``'s. Target: ratio (generate time / finecap time) >= 1 for every row.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from finecap.config import DecodeConfig
from finecap.decode import Generation
from finecap.models.blip import Blip
from finecap.models.clipcap import ClipCap
from finecap.models.presets import VLM_FAMILIES, build_world_lm, save_tiny_blip, tiny_vlm
from finecap.models.vlm import Vlm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)
from timing import interleaved, spread  # noqa: E402  (benchmarks/timing.py)


def agrees(gen: Generation, reference: torch.Tensor) -> tuple[bool, int]:
    """Whether finecap's captions equal ``generate``'s new tokens up to each caption's end (``generate`` pads a
    finished hypothesis with the pad id, or with EOS when the pad id is 0; finecap with the pad id), and how many of
    the captions end before the maximum length."""
    lengths = gen.lengths.tolist()
    same = all(gen.sequences[i, :n].tolist() == reference[i, :n].tolist() for i, n in enumerate(lengths))
    return same, sum(n < gen.sequences.shape[1] for n in lengths)


def clipcap_case(n: int, length: int) -> tuple[dict[str, Callable], Callable[[], bool]]:
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=3, hidden=128, heads=4, n_positions=64, dropout=0.0)
    model = ClipCap(lm, tok, feature_dim=256).eval()
    features = torch.randn(n, 256)
    common = dict(max_new_tokens=length, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=False,
                  min_new_tokens=0)  # fmt: skip

    def ours(k: int, rule: str = "keep"):
        cfg = DecodeConfig(strategy="greedy" if k == 1 else "beam", beam_size=k, max_length=length, batch_size=n,
                           finished_beams=rule)  # fmt: skip
        return model.generate(features, cfg)

    def reference(k: int) -> torch.Tensor:
        return lm.generate(inputs_embeds=model.mapper(features), num_beams=k, length_penalty=1.0, **common)

    def theirs(k: int):
        return tok.batch_decode(reference(k), skip_special_tokens=True)

    def same(k: int = 1) -> tuple[bool, int]:
        return agrees(ours(k, "set_aside"), reference(k))

    return {"finecap": ours, "generate": theirs}, same


def blip_case(n: int, length: int, folder: Path) -> tuple[dict[str, Callable], Callable[[], bool]]:
    save_tiny_blip(folder, image_size=32, vision_hidden=256, vision_layers=2, hidden=128, layers=3, heads=4,
                   positions=length + 2)  # fmt: skip
    model = Blip.from_pretrained(folder).eval()
    pixels = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))

    def ours(k: int, rule: str = "keep"):
        cfg = DecodeConfig(strategy="greedy" if k == 1 else "beam", beam_size=k, max_length=length, batch_size=n,
                           finished_beams=rule)  # fmt: skip
        return model.generate({"pixel_values": pixels}, cfg)

    def reference(k: int) -> torch.Tensor:
        return model.model.generate(pixel_values=pixels, max_new_tokens=length, num_beams=k, length_penalty=1.0,
                                    do_sample=False, min_new_tokens=0)  # fmt: skip

    def theirs(k: int):
        return model.tokenizer.batch_decode(reference(k), skip_special_tokens=True)

    def same(k: int = 1) -> tuple[bool, int]:
        return agrees(ours(k, "set_aside"), reference(k)[:, 1:])  # generate returns the [bos] it starts from

    return {"finecap": ours, "generate": theirs}, same


def vlm_case(family: str, n: int, length: int) -> tuple[dict[str, Callable], Callable[[], bool]]:
    torch.manual_seed(0)
    hf, processor = tiny_vlm(family, hidden=128, layers=3, heads=4, positions=64 + length)
    model = Vlm(hf, processor).eval()
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for _ in range(n)]
    inputs = dict(processor(text=[model.prompt_text] * n, images=[[im] for im in images], padding=True,
                            return_tensors="pt"))  # fmt: skip
    batch = inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]}
    prompt_len = inputs["input_ids"].shape[1]

    def ours(k: int, rule: str = "keep"):
        cfg = DecodeConfig(strategy="greedy" if k == 1 else "beam", beam_size=k, max_length=length, batch_size=n,
                           finished_beams=rule)  # fmt: skip
        return model.generate(batch, cfg)

    def reference(k: int) -> torch.Tensor:
        return hf.generate(**inputs, max_new_tokens=length, num_beams=k, length_penalty=1.0, do_sample=False,
                           min_new_tokens=0)[:, prompt_len:]  # fmt: skip

    def theirs(k: int):
        return model.tokenizer.batch_decode(reference(k), skip_special_tokens=True)

    def same(k: int = 1) -> tuple[bool, int]:
        return agrees(ours(k, "set_aside"), reference(k))

    return {"finecap": ours, "generate": theirs}, same


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--max-length", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        cases = {"clipcap": clipcap_case(args.images, args.max_length),
                 "blip": blip_case(args.images, args.max_length, Path(tmp) / "blip"),
                 **{f"vlm_{f}": vlm_case(f, args.images, args.max_length) for f in VLM_FAMILIES}}  # fmt: skip
        for name, (fns, same) in cases.items():
            (greedy_same, _), (beam_same, early) = same(1), same(5)
            print(f"{name}: identical to generate: greedy {greedy_same}, beam5 set_aside {beam_same} "
                  f"({early} of {args.images} beam captions end before --max-length)")  # fmt: skip
            for k, label, rule in ((1, "greedy", "keep"), (5, "beam5", "keep"), (5, "beam5_set_aside", "set_aside")):
                times = interleaved({"finecap": lambda fns=fns, k=k, rule=rule: fns["finecap"](k, rule),
                                     "generate": lambda fns=fns, k=k: fns["generate"](k)}, args.repeat)  # fmt: skip
                ours, ref = times["finecap"], times["generate"]
                results[f"{name}/{label}"] = {
                    "finecap_s": ours.best, "generate_s": ref.best, "ratio": ref.best / ours.best,
                    "finecap_runs": ours.runs, "generate_runs": ref.runs, "ratio_rounds": spread(ours, ref),
                }  # fmt: skip
    print(f"\n{args.images} images, {args.max_length} tokens, best of {args.repeat}; {machine_line()}")
    print(f"{'case':<30}{'finecap s':>11}{'generate s':>12}  ratio (range over the interleaved rounds)")
    for key, r in results.items():
        print(f"{key:<30}{r['finecap_s']:>11.3f}{r['generate_s']:>12.3f}  {r['ratio_rounds']}")
    if args.json:
        args.json.write_text(json.dumps({**results, "machine": machine()}, indent=2))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
