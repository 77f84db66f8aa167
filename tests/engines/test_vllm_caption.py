"""``finecap caption --engine vllm`` on an image folder and on a data set's split writes the captions ``--engine
finecap`` writes (greedy, float32), and so does the Python API (``Captioner.caption(..., engine="vllm")``)."""

from __future__ import annotations

import json

import pytest

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.api import Captioner  # noqa: E402
from finecap.app.cli import main  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

SETTINGS = ["decode.max_length=16", "vllm.max_model_len=128", f"vllm.kv_cache_memory_bytes={2**28}"]


@pytest.fixture(scope="module")
def files(captioner, tmp_path_factory):
    """The captioner saved as a model folder, and a folder of 5 image files."""
    root = tmp_path_factory.mktemp("caption")
    captioner.save(root / "smolvlm")
    (root / "photos").mkdir()
    (root / "out").mkdir()
    lines = []
    for i, image in enumerate(images(5, seed=3)):
        image.save(root / "photos" / f"img{i}.png")
        lines.append(json.dumps({"image": f"photos/img{i}.png", "captions": ["a caption"], "id": f"p{i}",
                                 "split": "test" if i % 2 else "train"}))  # fmt: skip
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    return root


def caption(files, engine: str, *inputs: str) -> dict:
    out = files / "out" / f"{engine}{len(inputs)}.json"
    inputs = inputs or ("--images", str(files / "photos"))
    argv = ["caption", "--checkpoint", str(files / "smolvlm"), *inputs, "--engine", engine, "--out", str(out),
            *SETTINGS]  # fmt: skip
    assert main(argv) == 0
    return {r["image_id"]: r["caption"] for r in json.loads(out.read_text())}


def test_caption_command_with_vllm_equals_finecap(files):
    ours, theirs = caption(files, "finecap"), caption(files, "vllm")
    assert sorted(theirs) == [f"img{i}.png" for i in range(5)]
    assert theirs == ours
    assert len(set(theirs.values())) > 1  # the images get different captions: the image reaches the model


def test_caption_command_on_a_split_with_vllm_equals_finecap(files):
    split = ("--data", str(files / "data.jsonl"), "--split", "test")
    ours, theirs = caption(files, "finecap", *split), caption(files, "vllm", *split)
    assert sorted(theirs) == ["p1", "p3"] and theirs == ours


def test_python_api_with_vllm_equals_finecap(files):
    captioner = Captioner.from_pretrained(files / "smolvlm", device="cpu")
    photos = sorted((files / "photos").iterdir())
    try:
        theirs = captioner.caption(photos, engine="vllm", max_length=16)
        again = captioner.caption(photos[:2], engine="vllm", max_length=16)  # the engine is kept between calls
    finally:
        captioner.close()
    assert theirs == captioner.caption(photos, max_length=16)
    assert again == theirs[:2]
