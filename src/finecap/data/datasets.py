"""Caption data sets and the collator that turns examples into the batch dict every captioner and objective reads.

Examples come from :class:`finecap.data.records.Record` s:

- training (``per_caption=True``): one example per reference caption, as ClipCap does, so an image with five
  references is seen five times per epoch, each time with another target (``data.train_unit=image`` or an
  objective sampling its own captions, e.g. REINFORCE, trains per image instead);
- validation / test (``per_caption=False``): one example per image; its target (for the validation loss) is the
  image's first reference caption, so the loss is comparable across runs and evaluations.

Every example also carries all references of its image (``references``), which later objectives read (CIDEr-D
rewards, self-retrieval bags). Images are represented by frozen encoder features (a ``(N, D)`` tensor aligned with
the records, see :mod:`finecap.data.features`) or, when the encoder is trained, by the decoded image that the
collator turns into ``pixel_values`` with the model's preprocessing.

Batch dict (see ``INTERFACES.md``)::

    features      (B, D) float          or  pixel_values (B, 3, H, W)  or the entries of the encoder's preprocess
                  dict (a VLM's prompt_ids, prompt_mask, pixel_values, ...)
    input_ids     (B, T) caption tokens + EOS, right-padded with the pad id, T <= data.max_tokens
    attention_mask(B, T) 1 on tokens (EOS included), 0 on padding
    labels        (B, T) input_ids with -100 at padding
    image_ids     list of B image ids;  references: list of B lists of reference captions;  index: (B,) example index
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from finecap.data.caption_fields import select_captions
from finecap.data.formats import data_format, format_options, read_dataset
from finecap.data.hashing import tree_version
from finecap.data.images import (
    DEFAULT_LIMITS,
    ImageLimits,
    ImageRefused,
    find_bad_images,
    load_record_image,
    record_label,
)
from finecap.data.records import MAX_LISTED, DataError, Record
from finecap.data.references import data_file, require_captions, select_split
from finecap.data.splits import split_unsplit
from finecap.data.targets import IGNORE_INDEX, encode_captions
from finecap.home import cache_dir as resolve_cache_dir
from finecap.utils.once import SaidOnce
from finecap.utils.system import launched_rank

if TYPE_CHECKING:
    from finecap.config import Config

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _read(
    fmt: str,
    path: Path,
    images: str,
    version: tuple[int, ...],
    options: tuple = (),
    allow_outside: bool = False,
    cache: Path | None = None,
) -> tuple[Record, ...]:
    return tuple(read_dataset(fmt, path, images=images or None, allow_outside=allow_outside, cache_dir=cache,
                              **dict(options)))  # fmt: skip


def _split_records(cfg: Config, split: str, captioned: bool) -> list[Record]:
    """:func:`load_records` before ``data.skip_bad_images``."""
    path = data_file(cfg)
    spec = data_format(cfg.data.format)
    if not path.exists() and not spec.hub_names:
        raise FileNotFoundError(f"{path}: data set file not found (data.path / world.out)")
    options = tuple(sorted(format_options(cfg.data.format, cfg).items()))
    read = _read if spec.cached else _read.__wrapped__  # read again: a folder of images changes below its own mtime
    # not its time alone: a rewrite in one tick too; a folder (a saved HF data set) by its files, rewritten in place
    version = tree_version(path) if spec.cached and path.exists() else ()
    records = read(cfg.data.format, path, cfg.data.images, version, options, cfg.data.allow_outside_paths,
                   resolve_cache_dir(cfg.run))  # fmt: skip
    records, unsplit = split_unsplit(cfg, records, path)
    records = select_captions(select_split(records, split, path, cfg.data.format, unsplit), cfg.data.captions, path)
    if captioned:
        require_captions(records, path, cfg.data.format, f"split {split!r}")
    return records


_SKIP_SAID = SaidOnce()
"""The splits whose left-out images :func:`load_records` has said in this command (:mod:`finecap.utils.once`)."""


def whole_split(cfg: Config, split: str) -> list[Record]:
    """The records of ``split`` as the data set lists them, those ``data.skip_bad_images`` leaves out too (no image
    decoded; no caption required): what a split's places count (:func:`split_places`)."""
    return _split_records(cfg, split, captioned=False)


def split_places(records: Sequence[Record]) -> dict[Any, int]:
    """Each image id of ``records``, a whole split (:func:`whole_split`, the images ``data.skip_bad_images`` leaves
    out counted) -> its place in the split as the data set lists it: what a split's sampling seeds follow
    (:func:`finecap.caption.generate_captions`), as ``--images``' follow a file's place in the files named, so that an
    image's samples do not depend on whether an earlier image was left out (docs/caption.md#a-stopped-run-resumes)."""
    return {r.image_id: place for place, r in enumerate(records)}


def skipped_images(cfg: Config, split: str, *, captioned: bool = True, model: Any = None) -> list[tuple[Record, str]]:
    """``(record, reason)`` of the images of ``split`` that ``data.skip_bad_images`` leaves out, in the split's order:
    those that do not decode (:func:`finecap.data.images.find_bad_images`, each file once per process) and, with
    ``model`` (a captioner, or an engine serving one), those its preprocessing refuses (:func:`refused_images`);
    empty when the option is off."""
    if not cfg.data.skip_bad_images:
        return []
    return _left_out(cfg, _split_records(cfg, split, captioned), model)


def _left_out(cfg: Config, records: list[Record], model: Any) -> list[tuple[Record, str]]:
    """:func:`skipped_images` of ``records``."""
    bad = find_bad_images(records, limits=ImageLimits.of(cfg.data))
    if model is None:
        return bad
    reasons = {id(r): reason for r, reason in bad}
    decoded = [r for r in records if id(r) not in reasons]
    reasons.update((id(r), reason) for r, reason in refused_images(decoded, model, cfg))
    return [(r, reasons[id(r)]) for r in records if id(r) in reasons]


_REFUSALS: weakref.WeakKeyDictionary[Any, dict[tuple, str | None]] = weakref.WeakKeyDictionary()
"""Per encoder (a captioner's ``encoder``): each image's refusal by :func:`refused_images` (``None``: taken), by its
label, JPEG draft and image budget."""


def refused_images(records: Sequence[Record], model: Any, cfg: Config) -> list[tuple[Record, str]]:
    """``(record, reason)`` of each of ``records`` whose image ``model``'s preprocessing refuses
    (:class:`~finecap.data.images.ImageRefused`: Qwen2-VL an aspect ratio over 200, Mistral 3 an image of one image
    token), the reason naming the image as the collator does (:func:`named_refusal`), the image decoded as a training
    item is (``data.jpeg_draft``, the image budget), in order. Only an encoder that declares it may refuse an image
    (``refuses_images``, :class:`finecap.models.captioner.ImageSide`) is asked, once per image, encoder and process (a
    validation at every evaluation asks again for free): each image is decoded and checked by what the encoder can
    tell without preprocessing it (``check_images``: its size), and preprocessed (:func:`collate_without_refused`
    over the image alone) only where a refusal needs the preprocessing's output (``refuses_processed_images``; an
    encoder without ``check_images`` preprocesses every image). Every other encoder refuses none, and costs nothing.
    The records' images must decode (:func:`_left_out` asks about those that do)."""
    from finecap.data.loading import encoder_draft

    encoder = model.encoder
    if encoder is None or not getattr(encoder, "refuses_images", False):
        return []
    check = getattr(encoder, "check_images", None)
    processed = check is None or getattr(encoder, "refuses_processed_images", True)
    draft, limits = encoder_draft(encoder, cfg.data), ImageLimits.of(cfg.data)
    data = CaptionDataset(records, per_caption=False, draft=draft, limits=limits)
    collator = model_collator(model, 1) if processed else None  # one token: the empty caption's EOS
    known = _REFUSALS.setdefault(encoder, {})
    out = []
    for i, record in enumerate(data.records):
        key = (record_label(record), draft, limits)
        if key not in known:
            known[key] = _refusal(data[i], check, collator)
        if known[key] is not None:
            out.append((record, known[key]))
    return out


def _refusal(
    item: dict[str, Any], check: Callable[[list], None] | None, collator: CaptionCollator | None
) -> str | None:
    """:func:`refused_images`' reason for the image of ``item`` (``None``: taken): ``check``'s refusal (the encoder's
    ``check_images``), else, with a ``collator``, the preprocessing's."""
    if check is not None:
        try:
            check([item["image"]])
        except ImageRefused as e:
            return str(named_refusal([item], e))
    if collator is None:
        return None
    _, refused = collate_without_refused(collator, [item])
    return refused[0][1] if refused else None


def load_records(
    cfg: Config, split: str, *, captioned: bool = True, model: Any = None, left_out: list | None = None
) -> list[Record]:
    """Records of ``split`` of the configured data set (:func:`finecap.data.references.data_file`), read once per
    file version; ``"train"`` also takes Karpathy's ``restval`` images, as most captioning code does. Captions are
    those of ``data.captions`` (:func:`finecap.data.caption_fields.select_captions`). Records whose data set names
    no split are split by ``data.val_fraction`` / ``data.test_fraction`` (:mod:`finecap.data.splits`, logged).
    ``captioned`` (training, validation, evaluation): images without a reference caption (an image folder's may
    have none) are an error naming them; captioning passes ``False``. With ``data.skip_bad_images`` every image is
    decoded once here and those that fail are left out, and with ``model`` (a captioner, or an engine serving one:
    training, its validation, captioning a split) so are those its preprocessing refuses (:func:`refused_images`),
    all counted in one warning (:func:`skipped_images`; said once per split in a command, by the first process of a
    launch alone: :mod:`finecap.utils.once`); without it the first bad image stops the command when it is read,
    named, and a refused one when it is preprocessed (the collator names it). ``left_out``: a list to which the
    ``(record, reason)`` of the images left out are appended, in the split's order, instead of being said here: the
    caller says them in its own one warning (a read before the model loads, whose images the read with the model
    says again; ``finecap caption``'s split, with the images refused when they are preprocessed).

    Training, captioning and evaluation come here or to :func:`finecap.data.references.load_references`, so every
    format works for each, ``data.format=hf`` (:mod:`finecap.data.formats.hf`, where ``data.path`` may also be a Hub
    name) included (``finecap boost`` writes back four formats only: :data:`finecap.boost.output.WRITABLE`)."""
    records = _split_records(cfg, split, captioned)
    note_prompts(cfg, records, data_file(cfg))
    if not cfg.data.skip_bad_images:
        return records
    bad = _left_out(cfg, records, model)
    if not bad:
        return records
    key = (str(data_file(cfg)), split, tuple(str(r.image_id) for r, _ in bad))
    if left_out is not None:
        left_out += bad
    elif launched_rank() == 0 and _SKIP_SAID.first(key):  # every process of a launch skips the same: said once
        shown = "; ".join(reason for _, reason in bad[:MAX_LISTED]) + ("; ..." if len(bad) > MAX_LISTED else "")
        log.warning("data: skipped %d of %d images of split %r (data.skip_bad_images=true): %s", len(bad),
                    len(records), split, shown)  # fmt: skip
    if len(bad) == len(records):
        which = "decodes" if model is None else "decodes and is taken by the model"
        raise DataError(f"{data_file(cfg)}: none of the {len(records)} images of split {split!r} {which} "
                        f"(data.skip_bad_images=true left out every one): {bad[0][1]}")  # fmt: skip
    left_out = {id(r) for r, _ in bad}
    return [r for r in records if id(r) not in left_out]


_PROMPTS_SAID = SaidOnce()


def note_prompts(cfg: Config, records: Sequence[Record], path: Path) -> None:
    """Say once (per data set, prompts and model) that the prompts ``records`` carry (a ``messages`` data set's user
    turns, :attr:`~finecap.data.records.Record.prompt`) are not what the captioner reads: every image gets its
    backbone's one prompt (``vlm.prompt``), or none (docs/data.md, "Chat JSONL"). A warning when the backbone has a
    prompt and the records say another; nothing when they say the same."""
    prompts = Counter(r.prompt for r in records if r.prompt)
    if not prompts:
        return
    kind = cfg.model.kind
    used = getattr(getattr(cfg, kind, None), "prompt", None)  # the backbone's section, when it has a prompt
    if used is not None and set(prompts) == {used}:
        return
    key = (str(path), tuple(sorted(prompts)), kind, used)
    if not _PROMPTS_SAID.first(key):
        return
    common, count = prompts.most_common(1)[0]
    if used is None:
        log.info("data: %d of %d records of %s carry a prompt (%d distinct); model.kind=%s reads none, so they are "
                 "not used", sum(prompts.values()), len(records), path, len(prompts), kind)  # fmt: skip
        return
    log.warning("data: %d of %d records of %s carry a prompt other than %s.prompt=%r (%d distinct; %r in %d); every "
                "image is captioned after the one prompt %s.prompt: set %s.prompt=%r to train with the data's",
                sum(prompts.values()) - prompts.get(used, 0), len(records), path, kind, used, len(prompts), common,
                count, kind, kind, common)  # fmt: skip


def validation_records(cfg: Config, model: Any = None, *, left_out: list | None = None) -> list[Record]:
    """The validation records a run evaluates on: the first ``train.eval_samples`` of the split (all of it with 0),
    what the validation loss and every validator read; ``model`` and ``left_out``: :func:`load_records`' (the images
    it refuses left out with ``data.skip_bad_images``; the images left out given to the caller, not said)."""
    records = load_records(cfg, "val", model=model, left_out=left_out)
    return records[: cfg.train.eval_samples] if cfg.train.eval_samples else records


class CaptionDataset(Dataset):
    """Examples ``(record, caption)`` of a list of records; ``features[i]`` belongs to ``records[i]``. Without
    features an item carries its decoded image (read when the item is, in a DataLoader worker: an embedded image of
    a Hugging Face data set too), JPEGs draft-decoded down to ``draft`` pixels
    (:func:`finecap.data.loading.encoder_draft`), images over the budget ``limits`` refused
    (:class:`~finecap.data.images.ImageLimits`: ``data.max_image_pixels``, ``data.max_aspect_ratio``).

    An item's ``index`` is its example's position (what training's per-example seeds follow), or with ``places``
    (``per_caption=False`` only) ``places[i]`` for ``records[i]``: its place in the whole split
    (:func:`split_places`), what a split's sampling seeds follow when images were left out of ``records``."""

    def __init__(
        self,
        records: Sequence[Record],
        *,
        per_caption: bool,
        features: torch.Tensor | None = None,
        draft: int | None = None,
        limits: ImageLimits = DEFAULT_LIMITS,
        places: Sequence[int] | None = None,
    ) -> None:
        if features is not None and len(features) != len(records):
            raise ValueError(f"CaptionDataset: {len(features)} feature rows for {len(records)} records")
        if places is not None and (per_caption or len(places) != len(records)):
            raise ValueError(f"CaptionDataset: places are one per record ({len(records)}) without per_caption")
        self.places = list(places) if places is not None else None
        self.records = list(records)
        self.features = features
        self.draft = draft
        self.limits = limits
        if per_caption:
            self.examples = [(i, j) for i, r in enumerate(self.records) for j in range(len(r.captions))]
            if not self.examples:
                raise ValueError("CaptionDataset: no reference captions to train on")
        else:
            self.examples = [(i, 0) for i in range(len(self.records))]

    def __len__(self) -> int:
        return len(self.examples)

    def image_id(self, index: int) -> Any:
        """The image id of example ``index`` (without loading anything)."""
        return self.records[self.examples[index][0]].image_id

    def __getitem__(self, index: int) -> dict[str, Any]:
        i, j = self.examples[index]
        record = self.records[i]
        item = {
            "index": index if self.places is None else self.places[i],
            "image_id": record.image_id,
            "caption": record.captions[j] if record.captions else "",
            "references": list(record.captions),
        }
        if self.features is not None:
            item["features"] = self.features[i]  # (D,)
        else:
            item["image"] = load_record_image(record, self.draft, self.limits)
            item["image_name"] = record_label(record)
        return item


@dataclass
class CaptionCollator:
    """Tokenises captions, appends EOS, truncates and pads them, and stacks features (or preprocesses images).

    A caption longer than ``max_tokens - 1`` tokens keeps its first ``max_tokens - 1`` tokens and still ends with
    EOS (so the model always learns to stop; training warns when more than 1 % of the training captions are so
    cut: docs/data.md#captions-longer-than-datamax_tokens); padding uses the tokenizer's pad id, or EOS when it has
    none (GPT-2); labels are -100 there either way. ``preprocess(images) -> (B, 3, H, W)`` is needed only without
    features; an image it refuses (:class:`finecap.data.images.ImageRefused`) is raised again naming the image (the
    item's ``image_name``, else its ``image_id``), a :class:`DataError` still telling which item it is
    (:func:`collate_without_refused` leaves such items out).
    ``keep_images``: the examples' PIL images are also kept, as ``batch["images"]`` (what a vLLM engine decodes RL
    rollouts from: ``decode.engine=vllm``). ``eos_token_id``: the token that ends a caption when it is not the
    tokenizer's EOS (the captioner's :attr:`~finecap.models.base.CaptionerBase.eos_token_id`,
    :func:`finecap.data.targets.encode_captions`); ``caption_prefix``: the text each caption is tokenised after (a
    captioner's ``caption_prefix``).
    """

    tokenizer: Any
    max_tokens: int
    preprocess: Callable[[list], torch.Tensor] | None = None
    keep_images: bool = False
    eos_token_id: int | None = None
    caption_prefix: str = ""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"data.max_tokens: must be >= 1 (EOS needs a place), got {self.max_tokens}")

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        captions = [it["caption"] for it in items]
        enc = encode_captions(self.tokenizer, captions, self.max_tokens, self.eos_token_id, self.caption_prefix)
        input_ids, attention_mask = enc["input_ids"], enc["attention_mask"]  # (B, T)
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX),  # (B, T)
            "image_ids": [it["image_id"] for it in items],
            "references": [it["references"] for it in items],
            "index": torch.tensor([it["index"] for it in items]),  # (B,)
        }
        if "features" in items[0]:
            batch["features"] = torch.stack([it["features"] for it in items]).float()  # (B, D)
        else:
            if self.preprocess is None:
                raise ValueError("CaptionCollator: examples carry images but no preprocess function was given")
            try:
                pixels = self.preprocess([it["image"] for it in items])  # (B, 3, H, W), or a dict of image inputs
            except ImageRefused as e:  # named here: the items know their images
                raise named_refusal(items, e) from None
            batch.update(pixels if isinstance(pixels, dict) else {"pixel_values": pixels})
            if self.keep_images:
                batch["images"] = [it["image"] for it in items]
        return batch


def named_refusal(items: Sequence[dict[str, Any]], refusal: ImageRefused) -> ImageRefused:
    """``refusal`` (of the ``refusal.index``-th image of ``items``' images) again, naming that image: the item's
    ``image_name``, else its ``image_id``. How the collator (:class:`CaptionCollator`) and :func:`refused_images` name
    a refused image."""
    item = items[refusal.index]
    name = item.get("image_name") or f"image {item['image_id']!r}"
    return ImageRefused(f"{name}: {refusal}", refusal.index)


def collate_without_refused(
    collator: Callable[[list[dict[str, Any]]], dict[str, Any]], items: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, list[tuple[dict[str, Any], str]]]:
    """``collator(items)`` (a :class:`CaptionCollator`) without the items whose image the model's preprocessing
    refuses (:class:`~finecap.data.images.ImageRefused`: Mistral 3 an image of one image token): the batch of the
    others (``None`` when none is left) and ``(item, reason)`` of each refused one, its reason naming the image as
    the collator names it. What ``data.skip_bad_images`` does with an image that decodes but that the model cannot
    take (``finecap caption --images``); without it the refusal is the error."""
    items = list(items)
    refused: list[tuple[dict[str, Any], str]] = []
    while items:
        try:
            return collator(items), refused
        except ImageRefused as e:  # the rest preprocessed again: a refusal is rare, and stops at the first
            refused.append((items.pop(e.index), str(e)))
    return None, refused


def model_collator(model: Any, max_tokens: int, keep_images: bool = False) -> CaptionCollator:
    """The collator for a captioner (or a generation engine serving one): its tokenizer, caption end token and
    caption prefix (a captioner's ``eos_token_id`` and ``caption_prefix``; an engine's tokenizer's EOS), and its
    encoder's image preprocessing (if it has an encoder); ``keep_images``: :class:`CaptionCollator`'s."""
    encoder = model.encoder
    preprocess = encoder.preprocess if encoder is not None else None
    return CaptionCollator(model.tokenizer, max_tokens, preprocess=preprocess, keep_images=keep_images,
                           eos_token_id=getattr(model, "eos_token_id", None),
                           caption_prefix=getattr(model, "caption_prefix", ""))  # fmt: skip


def to_device(batch: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """The batch with every tensor moved to ``device`` (lists stay as they are); pinned tensors
    (``data.pin_memory``) without blocking."""
    return {k: v.to(device, non_blocking=v.is_pinned()) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}  # fmt: skip
