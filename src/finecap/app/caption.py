"""``finecap caption``: caption a data split with a trained checkpoint and write COCO results.

``finecap caption --checkpoint DIR --split test --out results.json [decode.strategy=beam decode.beam_size=3 ...]``
calls :func:`main`: the model (architecture, weights, tokenizer) comes from the checkpoint; the data (``data.*``,
``world.out``) and the decoding options (``decode.*``) from the configuration given on the command line. Decoding is
:func:`finecap.caption.generate_captions` (frozen encoders read images through the image-feature cache).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from finecap.caption import generate_captions
from finecap.config import Config
from finecap.data.formats import write_results
from finecap.models.backbones import load_captioner
from finecap.train.checkpoint import model_dir
from finecap.train.engine import make_accelerator


def main(
    cfg: Config, *, checkpoint: str | Path, split: str = "test", out: str | Path, data: str | None = None
) -> Path:
    """Caption ``split`` with the captioner in ``checkpoint``; write COCO results JSON to ``out``; return ``out``.

    ``data`` overrides ``data.path``. Runs on every process of an ``accelerate launch``; only the main process
    writes.
    """
    if data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(data)))
    accelerator = make_accelerator(cfg.train)
    model = load_captioner(model_dir(checkpoint)).to(accelerator.device)
    captions = generate_captions(model, cfg, split, accelerator=accelerator)
    out = Path(out)
    if accelerator.is_main_process:
        write_results(out, {image_id: caps[0] for image_id, caps in captions.items()})
        accelerator.print(f"wrote {len(captions)} captions of split {split!r} to {out}")
    accelerator.wait_for_everyone()
    return out
