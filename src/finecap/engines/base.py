"""What a generation engine is: ``engine.generate(batch, decode, seeds) -> Generation``, the captions of a collated
batch of images decoded with the ``decode`` section (docs/architecture.md#generation-engines).

Engines derive from :class:`GenerationEngine`, which declares every fact and hook the captioning loops, the Python
API and the RL rollouts use, with defaults, so that none of them probes an engine or asks which one it is:

- ``reads_images``: the engine decodes the batch's PIL images (``batch["images"]``), so the training collator keeps
  them (``keep_images``); finecap's decoder reads the encoder's preprocessed tensors instead;
- ``external_logprobs``: the log-probs of its :class:`~finecap.decode.Generation` are another engine's, not the
  trainer's forward: RL rollouts apply the importance-sampling correction (:mod:`finecap.objectives.engine_mismatch`)
  and do not gather a sharded policy for it (it is sent the weights it needs by :meth:`~GenerationEngine.sync`);
- :meth:`~GenerationEngine.refusal` (a classmethod): why the engine cannot serve a captioner, or a configuration's
  captioner before it is built, in one line naming the backbone; ``None`` for one it serves;
- :meth:`~GenerationEngine.check_processes` (a classmethod): a refusal of a number of processes it cannot run in;
- :meth:`~GenerationEngine.open` (a classmethod) builds one serving a captioner; :meth:`~GenerationEngine.sync` brings
  its weights in step with the policy being trained; :meth:`~GenerationEngine.sleep` releases its device memory
  between rollouts; :meth:`~GenerationEngine.close` frees it (also ``with engine:``).

What the captioning loops read besides :meth:`~GenerationEngine.generate`: ``device`` (where the batch goes and the
generation comes back), ``tokenizer`` and ``encoder`` (the collator's tokenizer and preprocessing,
:func:`finecap.data.datasets.model_collator`), ``train_encoder`` / ``cache_features`` (whether a data set's frozen
image features may stand for the images) and :meth:`~GenerationEngine.decoding` (the block they decode in).

``decode.engine`` names the engine: a row of :data:`finecap.registry.ENGINES` or a dotted path ``pkg.module:Class``
to one's own subclass; :func:`engine_class` resolves it and :func:`open_engine` opens it, the one place that reads
the option (the configuration checks the name when it is loaded).
"""

from __future__ import annotations

import abc
import contextlib
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

from finecap.config import ConfigError
from finecap.registry import ENGINES, lookup
from finecap.utils.closing import Closeable

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from PIL import Image

    from finecap.config import Config, DecodeConfig
    from finecap.decode import Generation

OPTION = "decode.engine"
"""The option that names the engine, as errors name it."""


class GenerationEngine(Closeable, abc.ABC):
    """Base of generation engines: the facts and hooks the captioning loops, the API and the rollouts use, with
    defaults (module docstring). A subclass implements the abstract :meth:`open` and :meth:`generate`."""

    reads_images: ClassVar[bool] = False
    """The engine decodes the batch's PIL ``images`` (the collator keeps them)."""
    external_logprobs: ClassVar[bool] = False
    """Its log-probs come from another engine than the trainer (RL's importance correction applies)."""
    train_encoder: bool = False
    """Whether the vision encoder trains (then the loops never read cached features)."""
    cache_features: bool = False
    """Whether a data set's cached frozen image features may stand for the images (finecap's decoder over a frozen
    encoder); an engine reading images reads them."""
    device: torch.device | str = "cpu"
    """Where the batch's tensors go and where the returned generation is."""
    tokenizer: Any = None
    """The captioner's tokenizer (the collator's)."""

    # ---- what it serves, before it is built ---------------------------------------------------------------------

    @classmethod
    def refusal(cls, model_or_cfg: Any) -> str | None:
        """Why this engine cannot serve ``model_or_cfg`` (a built captioner, or a :class:`~finecap.config.Config`
        whose captioner is not built yet), in one line naming the backbone and the engine that serves it; ``None``:
        served (the default: every backbone)."""
        return None

    @classmethod
    def decode_refusal(cls, model: Any, decode: DecodeConfig) -> str | None:
        """Why this engine cannot decode the built captioner ``model``'s captions with the ``decode`` settings, in one
        line naming the option at fault; ``None``: it can (the default). Asked when the engine is opened
        (:func:`open_engine`) and by the RL objectives' setup for their rollouts' settings
        (:meth:`finecap.engines.rollouts.RolloutEngine.check_model`), so that a run stops before any work; the
        engine's ``generate`` still refuses such settings, given later."""
        return None

    @classmethod
    def check_processes(cls, cfg: Config, processes: int, *, rollouts: bool = False) -> None:
        """Refuse, with a :class:`~finecap.config.ConfigError` in one line, running in ``processes`` processes (an
        engine each: RL ``rollouts`` of a training job, or captioning under ``accelerate launch``); the default
        runs in any number."""
        return

    @classmethod
    def device_share(cls, model: Any, cfg: Config, device_bytes: int | None, cuda: bool) -> int:
        """Bytes the engine, colocated with training, holds on the training device beside the step for the captioner
        ``model`` (what ``finecap train --dry-run``'s memory forecast adds; ``device_bytes``: the device's memory,
        ``None`` when unknown; ``cuda``: the device is a GPU); the default holds none (finecap's decoder is the
        captioner itself)."""
        return 0

    @classmethod
    @abc.abstractmethod
    def open(cls, model: Any, cfg: Config, *, tempered: bool = False) -> GenerationEngine:
        """An engine serving the captioner ``model`` as ``cfg`` configures (its ``decode`` is what
        :meth:`generate` receives per call; other sections, such as ``vllm``, and ``run.seed`` are the engine's).
        ``tempered``: the log-probs returned are of the temperature-scaled distribution sampled from, not the
        model's own (RL's ``rl.scaled_logprob`` with sampling)."""

    # ---- generation ---------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def generate(self, batch: dict[str, Any], decode: DecodeConfig, seeds: torch.Tensor | None = None) -> Generation:
        """The captions of the collated ``batch`` (its rows on :attr:`device`) decoded with ``decode``,
        ``decode.num_return_sequences`` rows per image in order; ``seeds``: one sampling seed per image. Every
        caption has at least one token: its tokens end with its stop token, which ``lengths`` counts (or are the
        ``decode.max_length`` tokens it was cut at); RL rollouts refuse a caption of none (:func:`check_lengths`)."""

    @property
    def encoder(self) -> Any:
        """The collator's image preprocessing (an object with ``preprocess(images) -> dict``): by default this
        engine's :meth:`preprocess`, which keeps the images as they are."""
        return self

    def preprocess(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """The images as they are (``{"images": [...]}``, RGB): what an engine reading images decodes."""
        return {"images": [im.convert("RGB") for im in images]}

    def decoding(self, autocast: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        """The block the captioning loops decode in, given the run's ``autocast``; the default is nothing (an engine
        that computes in its own dtype, with no torch module of this process to set)."""
        return contextlib.nullcontext()

    # ---- life -------------------------------------------------------------------------------------------------------

    def sync(self, policy: Any) -> None:
        """Bring the engine's weights in step with ``policy``'s (the captioner being trained), after it changed; the
        default has nothing to send."""
        return

    def sleep(self) -> None:
        """Release the engine's device memory until it is next used (its :meth:`generate` or :meth:`sync` takes it
        back): RL rollouts call it after each generation, so that the training step has the memory (vLLM's
        ``vllm.enable_sleep_mode``); the default keeps what it holds."""
        return

    def close(self) -> None:
        """Free what the engine holds (its model may be built again by :meth:`open`); the default holds nothing."""
        return


def check_lengths(gen: Generation, decode: DecodeConfig) -> Generation:
    """``gen``, as the engine ``decode.engine`` names returned it (:meth:`~GenerationEngine.generate` with
    ``decode``), if every caption has a token (its stop token counts: :class:`~finecap.decode.Generation`'s
    ``lengths``); else a ``ValueError`` naming the engine, how many captions have none and the first's row. Such a
    caption breaks the engine's contract, and an RL rollout would take it silently: its reward (that of ``""``)
    counts in its image's baseline or group statistics, but its log-prob is a sum over no token, so its advantage
    moves nothing while the loss's means and the ``rl.entropy_coef`` bonus count it as a caption with no term (until
    2026-11-29 nothing refused it). finecap's decoder and vLLM's engine count the stop token: they never return one.

    >>> import torch
    >>> from finecap.config import DecodeConfig
    >>> from finecap.decode import Generation
    >>> gen = Generation(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.tensor([2, 0]),
    ...                  torch.tensor([0, 0]), torch.zeros(2), ["a b", ""])
    >>> check_lengths(gen, DecodeConfig(engine="pkg.mine:Engine"))
    Traceback (most recent call last):
    ...
    ValueError: decode.engine=pkg.mine:Engine returned 1 of 2 captions with no token (the first: row 1, ''); ...
    """
    empty = (gen.lengths < 1).nonzero().flatten().tolist()
    if empty:
        row = empty[0]
        text = gen.texts[row] if row < len(gen.texts) else ""
        raise ValueError(
            f"{OPTION}={decode.engine} returned {len(empty)} of {len(gen)} captions with no token (the first: row "
            f"{row}, {text!r}); a caption's tokens end with its stop token, which Generation.lengths counts, so each "
            "has at least one (GenerationEngine.generate)"
        )
    return gen


def images_of(batch: dict[str, Any], engine: str) -> list[Any]:
    """The batch's PIL ``images`` for an engine that reads images (``engine``: what the message names, e.g.
    ``"decode.engine=vllm"``); a batch without them is a ``ValueError`` saying how to collate one."""
    if "images" not in batch:
        raise ValueError(f"{engine}: the batch has no 'images' (PIL images) for the engine to caption; collate it "
                         "with keep_images=True (finecap.data.datasets.CaptionCollator)")  # fmt: skip
    return batch["images"]


def engine_class(decode: DecodeConfig) -> type[GenerationEngine]:
    """The engine class ``decode.engine`` names (a row of :data:`finecap.registry.ENGINES` or a dotted path); one
    that is no :class:`GenerationEngine` subclass is a :class:`~finecap.config.ConfigError` naming the option. With
    :func:`open_engine`, the one place that reads ``decode.engine``."""
    try:
        cls = lookup(decode.engine, ENGINES, OPTION, "generation engine")
    except ValueError as e:
        raise ConfigError(str(e), key=OPTION) from None
    if not (isinstance(cls, type) and issubclass(cls, GenerationEngine)):
        raise ConfigError(f"{OPTION}: {decode.engine!r} is not a GenerationEngine subclass "
                          "(finecap.engines.base.GenerationEngine)", key=OPTION)  # fmt: skip
    return cls


def open_engine(cfg: Config, model: Any, *, tempered: bool = False) -> GenerationEngine:
    """The engine ``cfg.decode.engine`` names, opened to serve the captioner ``model`` (:meth:`GenerationEngine.open`);
    a captioner it does not serve, or decoding settings it cannot decode that captioner's captions with, is a
    :class:`~finecap.config.ConfigError` naming ``decode.engine`` (its :meth:`~GenerationEngine.refusal`,
    :meth:`~GenerationEngine.decode_refusal`), before the engine is built. The caller closes it
    (``with open_engine(cfg, model) as engine:``)."""
    cls = engine_class(cfg.decode)
    reason = cls.refusal(model) or cls.decode_refusal(model, cfg.decode)
    if reason is not None:
        raise ConfigError(reason, key=OPTION)
    return cls.open(model, cfg, tempered=tempered)
