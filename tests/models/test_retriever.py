"""Retriever: tiny random CLIPModel saved with save_pretrained and loaded through the user's code path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import processors
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

from finecap.config import load
from finecap.data.features import CACHE_SUBDIR, lock_file, model_features
from finecap.data.records import Record
from finecap.models.retriever import Retriever, load_retriever
from finecap.models.tokenizer import world_tokenizer

WORDS = ["a", "red", "blue", "circle", "square", "on", "grass", "big", "small", "the"]


@dataclass
class Rec:
    image_id: int | str
    path: Path


def tiny_clip(max_pos: int = 16) -> CLIPModel:
    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=5 + len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=max_pos, eos_token_id=4, pad_token_id=0,
                         bos_token_id=3),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16,
    )  # fmt: skip
    return CLIPModel(cfg).eval()


def processor() -> CLIPImageProcessor:
    return CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                              image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.25, 0.25])  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clip")
    Retriever(tiny_clip(), world_tokenizer(WORDS), processor(), batch_size=2).save(out)
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Rec]:
    out = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    recs = []
    for i in range(5):
        p = out / f"{i:06d}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(p)
        recs.append(Rec(i, p))
    return recs


def test_from_pretrained_loads_recorded_class(ckpt):
    r = Retriever.from_pretrained(ckpt, batch_size=2)
    assert isinstance(r.model, CLIPModel)
    assert r.pool_eos_id == 4
    assert r.max_length == 16  # min(tokenizer model_max_length 64, text positions 16)


def test_weight_bytes_are_what_from_pretrained_holds(ckpt, tmp_path):
    """The memory forecast's bytes per frozen retriever copy (``finecap train --dry-run``), counted from the
    configuration on the meta device, equal the storage of the model ``from_pretrained`` loads (parameters and
    buffers), for a checkpoint saved in float32 and one in bfloat16 (loaded in the dtype it was saved in); CLIP
    ViT-B/32 (transformers' CLIPConfig defaults are its shapes) is the 605,110,268 bytes the recipes' sizing uses."""
    from finecap.models.forecast import RETRIEVERS

    half = tmp_path / "bf16"
    Retriever(tiny_clip().to(torch.bfloat16), world_tokenizer(WORDS), processor()).save(half)
    for folder, dtype in ((ckpt, torch.float32), (half, torch.bfloat16)):
        model = Retriever.from_pretrained(folder).model
        held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        assert model.dtype == dtype and Retriever.weight_bytes(folder) == held
    b32 = tmp_path / "b32"
    CLIPConfig(architectures=["CLIPModel"]).save_pretrained(b32)
    assert Retriever.weight_bytes(b32) == RETRIEVERS["openai/clip-vit-base-patch32"] == 605_110_268


def test_embeddings_unit_norm_and_similarity_matches_clip_forward(ckpt, images):
    r = Retriever.from_pretrained(ckpt, batch_size=2)
    pil = [Image.open(x.path) for x in images]
    pv = r.preprocess(pil)
    assert pv.shape == (5, 3, 32, 32)
    img = r.embed_images(pv)
    assert torch.allclose(img, r.embed_images(pil), atol=1e-6)  # PIL input goes through the same processor
    texts = ["a red circle", "a big blue square on the grass", "small"]
    txt = r.embed_texts(texts)
    assert img.shape == (5, 16) and txt.shape == (3, 16)
    assert torch.allclose(img.norm(dim=-1), torch.ones(5), atol=1e-5)
    ids, mask = r.tokenize(texts)
    with torch.no_grad():
        out = r.model(input_ids=ids, attention_mask=mask, pixel_values=pv)
    assert torch.allclose(r.similarity(txt, img), out.logits_per_text, atol=1e-4)


def test_text_batching_and_padding_do_not_change_embeddings(ckpt):
    r = Retriever.from_pretrained(ckpt, batch_size=1)
    texts = ["a red circle", "a big blue square on the grass on the grass"]
    one_by_one = r.embed_texts(texts)
    r.batch_size = 8
    assert torch.allclose(one_by_one, r.embed_texts(texts), atol=1e-5)


def test_a_left_padding_tokenizer_is_padded_right_so_batches_do_not_change_embeddings(ckpt, tmp_path):
    # A checkpoint whose tokenizer pads on the left: CLIP's text tower numbers positions from 0 and pools at the EOS,
    # so "a red circle" left-padded to the longer text's 11 tokens sat at positions 7-10 with its EOS at 3 (the
    # appended one), and its embedding moved (max |diff| 0.46 before the fix) with the batch it was in.
    r = Retriever.from_pretrained(ckpt)
    texts = ["a red circle", "a big blue square on the grass on the grass"]
    alone = r.embed_texts(texts[:1])
    r.tokenizer.padding_side = "left"
    r.save(tmp_path / "left")
    left = Retriever.from_pretrained(tmp_path / "left")
    assert left.tokenizer.padding_side == "left"
    ids, mask = left.tokenize(texts)
    assert ids[0].tolist()[:4] == [5, 6, 8, 4] and mask[0].tolist()[4:] == [0] * 7  # padded on the right
    assert torch.allclose(left.embed_texts(texts)[:1], alone, atol=1e-6)


def test_vision_features_unnormalised_projection(ckpt, images):
    r = Retriever.from_pretrained(ckpt)
    pv = r.preprocess([Image.open(images[0].path)])
    f = r.vision_features(pv)
    with torch.no_grad():
        ref = r.model.get_image_features(pixel_values=pv).pooler_output
    assert torch.allclose(f.detach(), ref)
    assert f.requires_grad  # respects the caller's grad mode (the captioner may train through it)
    assert torch.allclose(r.embed_images(pv), ref / ref.norm(dim=-1, keepdim=True), atol=1e-6)


def test_missing_eos_is_appended_for_eos_pooling(ckpt):
    r = Retriever.from_pretrained(ckpt)
    ids_ok, _ = r.tokenize(["a red circle"])
    assert ids_ok.tolist() == [[5, 6, 8, 4]]  # word ids (WORDS order after 5 specials) + <eos>=4
    want = r.embed_texts(["a red circle"])
    r.tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", special_tokens=[])
    ids, mask = r.tokenize(["a red circle", "a"])
    # EOS appended after the last real token; the shorter row keeps its padding after the EOS.
    assert ids.tolist() == [[5, 6, 8, 4], [5, 4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert torch.allclose(r.embed_texts(["a red circle"]), want, atol=1e-6)
    # Truncated at max_length (16): EOS replaces the last token.
    ids, _ = r.tokenize([" ".join(["red"] * 30)])
    assert ids.shape == (1, 16) and ids[0, -1].item() == 4


def test_a_captions_eos_text_is_text_not_where_the_text_tower_pools(ckpt):
    # CLIP pools at the first EOS: "<eos>" read as the token (before: ids [5, 6, 8, 4, 10, 11, 4], two EOS) scored
    # "a red circle <eos> on grass" as "a red circle", bit for bit. As text it is "<", "eos", ">" (unknown words).
    r = Retriever.from_pretrained(ckpt)
    text = "a red circle <eos> on grass"
    ids, _ = r.tokenize([text])
    assert ids.tolist() == [[5, 6, 8, 1, 1, 1, 10, 11, 4]]  # one EOS: the tokenizer's own, last
    assert r.token_counts([text]) == [9]
    assert not torch.allclose(r.embed_texts([text]), r.embed_texts(["a red circle"]), atol=1e-3)
    long = Retriever(r.model, r.tokenizer, r.image_processor, long_text="chunks")
    windows, _, _ = long.windows([text])
    assert windows.tolist() == ids.tolist()


def test_save_reload_roundtrip(ckpt, images, tmp_path):
    r = Retriever.from_pretrained(ckpt)
    r.save(tmp_path / "again")
    r2 = Retriever.from_pretrained(tmp_path / "again")
    assert torch.allclose(r.embed_texts(["a red circle"]), r2.embed_texts(["a red circle"]))
    assert r.identity() == r2.identity()


def test_image_cache_reused_and_keyed_by_model_and_dataset(ckpt, images, tmp_path, monkeypatch):
    r = Retriever.from_pretrained(ckpt, batch_size=2)
    cache = tmp_path / "cache"
    first = r.image_embeddings(images, cache)
    files = list((cache / CACHE_SUBDIR).glob("*.safetensors"))
    assert len(files) == 1
    direct = r.embed_images([Image.open(x.path) for x in images])
    assert torch.allclose(first, direct, atol=1e-6)
    raw = r.image_features(images, cache)  # unnormalised features from the same file
    assert torch.allclose(torch.nn.functional.normalize(raw, dim=-1), first, atol=1e-6)

    def boom(_records):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(r, "_encode_images", boom)
    assert torch.equal(r.image_embeddings(images, cache), first)  # served from the cache
    monkeypatch.undo()

    # Another data set (subset) -> another file.
    r.image_embeddings(images[:3], cache)
    assert len(list((cache / CACHE_SUBDIR).glob("*.safetensors"))) == 2
    # Another model (one weight changed) -> another file, different features.
    with torch.no_grad():
        r.model.visual_projection.weight.mul_(-1)
    flipped = r.image_embeddings(images, cache)
    assert len(list((cache / CACHE_SUBDIR).glob("*.safetensors"))) == 3
    assert torch.allclose(flipped, -first, atol=1e-6)


def test_text_cache_reused_and_keyed_by_texts_and_model(ckpt, tmp_path, monkeypatch):
    r = Retriever.from_pretrained(ckpt, batch_size=2)
    cache = tmp_path / "cache"
    texts = ["a red circle", "a big blue square on the grass", "the small circle"]
    first = r.text_embeddings(texts, cache)
    assert torch.equal(first, r.embed_texts(texts))  # the same numbers as without the cache
    (path,) = (cache / CACHE_SUBDIR).glob("texts-*.safetensors")

    def boom(_texts):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(r, "embed_texts", boom)
    assert torch.equal(r.text_embeddings(texts, cache), first)  # served from the file
    monkeypatch.undo()
    # Other texts, or the same texts in another order -> another file with their own rows.
    swapped = r.text_embeddings(texts[::-1], cache)
    assert torch.allclose(swapped, first.flip(0), atol=1e-6)  # batches pad differently: rounding only
    r.text_embeddings(texts[:2], cache)
    assert len(list((cache / CACHE_SUBDIR).glob("texts-*.safetensors"))) == 3
    # Another text tower (one weight changed) -> recomputed, not served from the old file.
    with torch.no_grad():
        r.model.text_projection.weight.mul_(-1)
    assert torch.allclose(r.text_embeddings(texts, cache), -first, atol=1e-6)
    assert len(list((cache / CACHE_SUBDIR).glob("texts-*.safetensors"))) == 4
    assert r.text_embeddings([], cache).shape == (0, r.dim)


def test_rewritten_image_is_recomputed(ckpt, images, tmp_path):
    r = Retriever.from_pretrained(ckpt)
    recs = [Rec(i, tmp_path / f"{i}.png") for i in range(2)]
    for rec, src in zip(recs, images, strict=False):
        Image.open(src.path).save(rec.path)
    cache = tmp_path / "cache"
    before = r.image_embeddings(recs, cache)
    Image.open(images[4].path).save(recs[0].path)  # another image under the same name
    st = recs[0].path.stat()
    os.utime(recs[0].path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # (even within one mtime tick)
    after = r.image_embeddings(recs, cache)
    assert torch.allclose(after[1], before[1]) and not torch.allclose(after[0], before[0])
    assert torch.allclose(after, r.embed_images([Image.open(x.path) for x in recs]), atol=1e-6)


class VisionStandIn(torch.nn.Module):
    """A captioner whose frozen encoder (``model.encoder``) is the retriever's own model and preprocessing; its
    forward must not run (the features are in the cache already)."""

    def __init__(self, retriever):
        super().__init__()
        self.encoder = retriever.model
        self.encoder.preprocess = retriever.preprocess
        self.encoder.image_processor = retriever.image_processor

        def boom(pixel_values):
            raise AssertionError("recomputed although cached")

        self.encoder.forward = boom


def test_retriever_and_captioner_features_share_one_cache(ckpt, images, tmp_path):
    r = Retriever.from_pretrained(ckpt)
    cfg = load(None, [f"run.cache_dir={tmp_path}"])
    recs = [Record(x.image_id, x.path, "test") for x in images]
    want = r.image_features(recs, tmp_path)
    # The same weights, class and preprocessing on the same images and split: the same file, from either side.
    got = model_features(VisionStandIn(r), recs, cfg, "test", progress=False)
    assert torch.equal(got, want)
    (made,) = (tmp_path / CACHE_SUBDIR).glob("*.safetensors")
    assert made.name[:5] == "test-" and sorted((tmp_path / CACHE_SUBDIR).iterdir()) == [lock_file(made), made]
    assert [p.name for p in tmp_path.iterdir()] == [CACHE_SUBDIR]


def test_load_retriever_only_loads(ckpt, tmp_path):
    cfg = load(None, [f"run.cache_dir={tmp_path}", f"world.out={tmp_path / 'world'}"])
    with pytest.raises(FileNotFoundError, match="finecap retriever train"):
        load_retriever(cfg)  # no world encoder trained for cfg: an error naming the command, never training
    assert not (tmp_path / "world").exists()
    cfg = load(None, [f"run.cache_dir={tmp_path}", f"retriever.checkpoint={ckpt}"])
    assert isinstance(load_retriever(cfg).model, CLIPModel)


def test_corrupt_cache_file_is_recomputed(ckpt, images, tmp_path):
    r = Retriever.from_pretrained(ckpt)
    cache = tmp_path / "cache"
    want = r.image_embeddings(images, cache)
    (f,) = (cache / CACHE_SUBDIR).glob("*.safetensors")
    f.write_bytes(b"garbage")
    assert torch.allclose(r.image_embeddings(images, cache), want, atol=1e-6)


def test_rejects_non_dual_encoder():
    with pytest.raises(TypeError, match="no 'get_image_features'"):
        Retriever(torch.nn.Linear(2, 2), None, None, name="lin")


def test_the_retrieval_reward_is_clips_own_caption_to_image_log_softmax(ckpt, images):
    # DiscriTune's receiver takes CLIP's logits_per_text (exp(logit_scale) x cosine of the normalised embeddings, a
    # caption's row over the images) and the reward is their log-softmax at the target (the cross-entropy's negative):
    # the reward with sr.logit_scale=0 (the recipes') is that, caption n's target image n among the 3 images
    import torch.nn.functional as F

    from finecap.config import SRConfig
    from finecap.rewards.retrieval import RetrievalReward

    r = Retriever.from_pretrained(ckpt, batch_size=2)
    assert r.logit_scale == pytest.approx(float(r.model.logit_scale.detach().exp()))  # 1 / 0.07 (CLIP's initial)
    pil = [Image.open(x.path) for x in images[:3]]
    texts = ["a red circle", "a big blue square on the grass", "small"]
    reward = RetrievalReward(r, SRConfig(), image_ids=[0, 1, 2], embeddings=r.embed_images(pil))
    out = reward(texts, {"image_ids": [0, 1, 2]})
    ids, mask = r.tokenize(texts)
    with torch.no_grad():
        logits = r.model(input_ids=ids, attention_mask=mask, pixel_values=r.preprocess(pil)).logits_per_text  # (3, 3)
    expected = F.log_softmax(logits, dim=1).diagonal()  # (3,) each caption over the images
    assert torch.allclose(out.total, expected, atol=1e-4)
    # the other direction (an image over the captions) and the unscaled cosines give other values: the test can tell
    assert not torch.allclose(F.log_softmax(logits, dim=0).diagonal(), expected, atol=1e-3)
    assert not torch.allclose(F.log_softmax(logits / r.logit_scale, dim=1).diagonal(), expected, atol=1e-3)
