"""What reading a run imports: a command pays for the modules it needs, not for a model family's modeling code or
the retriever it never uses. Each check runs in a fresh interpreter and reads its ``sys.modules`` afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # fresh interpreters, seconds each

SRC = Path(__file__).resolve().parents[2] / "src"


def loaded_after(code: str, *argv: str, watched: tuple[str, ...]) -> dict[str, bool]:
    """``{module: imported}`` for each of ``watched`` once ``code`` has run in a fresh interpreter (``argv`` its
    ``sys.argv[1:]``)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {list(watched)!r}}}))\n"
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


FINGERPRINT = """
import json, sys
from pathlib import Path
from finecap.config import Config
from finecap.train.fingerprint import captioner_fingerprint
folder = Path(sys.argv[1])
print(json.dumps(captioner_fingerprint(Config(), folder)))
"""


def test_the_fingerprint_of_a_clipcap_checkpoint_imports_no_blip_no_presets_no_retriever(tmp_path):
    # `finecap caption --checkpoint RUN` checks the run's fingerprints first: for a ClipCap checkpoint that resolves
    # the ClipCap class, which imported the tiny presets and through them BLIP's modeling code and the retriever
    encoder = tmp_path / "clip"
    encoder.mkdir()
    (encoder / "config.json").write_text("{}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "captioner.json").write_text(json.dumps({"kind": "clipcap", "encoder_source": str(encoder),
                                                      "encoder_saved": False}))  # fmt: skip
    watched = ("finecap.models.clipcap", "transformers.models.blip.modeling_blip", "finecap.models.presets",
               "finecap.models.retriever", "finecap.models.world_encoder")  # fmt: skip
    state = loaded_after(FINGERPRINT, str(model), watched=watched)
    assert state == {"finecap.models.clipcap": True, "transformers.models.blip.modeling_blip": False,
                     "finecap.models.presets": False, "finecap.models.retriever": False,
                     "finecap.models.world_encoder": False}  # fmt: skip


FAMILY_BAGS = """
import sys
from pathlib import Path
from types import SimpleNamespace
from finecap.app.report import family_bag_source
from finecap.config import Config
assert family_bag_source(SimpleNamespace(run_dir=Path(sys.argv[1])), Config()) is None
"""


def test_the_report_of_a_run_without_family_bags_imports_no_torch_no_retriever(tmp_path):
    # `finecap report` imported the VCB demo for one table's row names, and the family demo before looking whether
    # the run holds family bags; both import the retriever (torch, CLIP)
    watched = ("torch", "finecap.models.retriever", "finecap.app.demo_vcb", "finecap.app.demo_families")
    state = loaded_after(FAMILY_BAGS, str(tmp_path), watched=watched)
    assert state == dict.fromkeys(watched, False)


WORLD_FINGERPRINT = """
import sys
from finecap.config import load
from finecap.train.fingerprint import retriever_fingerprint
fingerprint = retriever_fingerprint(load(None, ["data.format=world", f"run.cache_dir={sys.argv[1]}"]))
assert fingerprint["kind"] == "world-encoder" and fingerprint["sha256"] is None, fingerprint
"""


def test_the_world_encoder_fingerprint_of_a_world_run_imports_no_torch(tmp_path):
    # `finecap report` of a world run checks its retriever's fingerprint, the world encoder's cache key: the module
    # of the key was the encoder's own, which imports torch and transformers' CLIP and ConvNeXt
    watched = ("torch", "transformers", "finecap.models.world_encoder")
    assert loaded_after(WORLD_FINGERPRINT, str(tmp_path), watched=watched) == dict.fromkeys(watched, False)


LOAD = f"""{FINGERPRINT}
from finecap.models.backbones import load_captioner
load_captioner(folder)
"""
OTHER_FAMILIES = ("finecap.models.presets", "finecap.models.retriever", "transformers.models.gpt2.modeling_gpt2",
                  "transformers.models.clip.modeling_clip")  # fmt: skip


def test_reading_a_blip_checkpoint_imports_no_gpt2_no_clip_no_presets_no_retriever(tmp_path):
    # `finecap caption --checkpoint RUN` (and eval, export, the reward server) checks the run's fingerprints and loads
    # the captioner: finecap.models.blip imported the tiny presets at module level (the world BLIP's builder, the
    # image processor's class), and through them GPT-2's and CLIP's modeling code and the retriever
    from finecap.models.blip import Blip
    from finecap.models.presets import save_tiny_blip

    folder = Blip.from_pretrained(save_tiny_blip(tmp_path / "blip")).save(tmp_path / "ckpt")
    watched = ("finecap.models.blip", "transformers.models.blip.modeling_blip", *OTHER_FAMILIES)
    state = loaded_after(LOAD, str(folder), watched=watched)
    assert state == {**dict.fromkeys(watched[:2], True), **dict.fromkeys(OTHER_FAMILIES, False)}


def test_reading_a_vlm_checkpoint_imports_no_gpt2_no_clip_no_blip_no_presets_no_retriever(tmp_path):
    # as for BLIP: finecap.models.vlm imported the tiny presets at module level for the world VLM's builder. The
    # checkpoint is an Idefics3 (SmolVLM's architecture): its vision tower is its own, so CLIP's is another family's
    from finecap.models.presets import save_tiny_vlm
    from finecap.models.vlm import Vlm

    folder = Vlm.from_pretrained(save_tiny_vlm(tmp_path / "idefics3", "idefics3")).save(tmp_path / "ckpt")
    reader = ("finecap.models.vlm", "transformers.models.idefics3.modeling_idefics3")
    watched = (*reader, "transformers.models.blip.modeling_blip", *OTHER_FAMILIES)
    state = loaded_after(LOAD, str(folder), watched=watched)
    assert state == {**dict.fromkeys(reader, True), **dict.fromkeys(watched[2:], False)}


TEXT_EVAL = """
import contextlib, io, sys
from finecap.app.cli import main
sys.argv = ["finecap", "eval", "--predictions", sys.argv[1], "--references", sys.argv[2], "--metrics",
            "bleu,rouge,cider", "--format", "json"]
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main() in (0, None)
assert '"CIDEr-D"' in out.getvalue(), out.getvalue()
"""


def test_finecap_eval_of_the_ngram_metrics_imports_no_meteor_nor_numpy_ma(tmp_path):
    # `finecap eval --metrics bleu,rouge,cider` (the benchmark's, pycocoevalcap's three): finecap.metrics.groups and
    # cocoeval imported METEOR's package at start-up for its exception class, and with it snowballstemmer's stemmers
    # of every language (about 20 ms of a 0.8 s run, benchmarks/eval_end_to_end.py; docs/evaluation.md#speed);
    # np.unique and np.isin (the word ids of tokens over 8 bytes, the PTB tokenizer's kept periods) imported
    # numpy.ma (6-7 ms) to ask whether an array is masked
    refs = {"images": [{"id": i} for i in (1, 2)],
            "annotations": [{"id": k, "image_id": i, "caption": f"A dog number {k} is skateboarding on the grass."}
                            for k, i in enumerate((1, 1, 2, 2))]}  # fmt: skip
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    results = [{"image_id": i, "caption": "a skateboarding dog"} for i in (1, 2)]
    (tmp_path / "results.json").write_text(json.dumps(results))
    watched = ("finecap.metrics.meteor", "snowballstemmer", "numpy.ma")
    state = loaded_after(TEXT_EVAL, str(tmp_path / "results.json"), str(tmp_path / "refs.json"), watched=watched)
    assert state == dict.fromkeys(watched, False)
