"""The Python API for notebooks and scripts: :func:`train` trains a captioner from a recipe, :class:`Captioner`
captions images with a trained checkpoint, :func:`evaluate` scores captions against references. All three are
exported by the package (``finecap.train(...)``, ``from finecap import Captioner, evaluate``), imported on first use,
so ``import finecap`` stays cheap (no torch).

They are thin: training is :func:`finecap.train.run.train` (what ``finecap train`` runs), captioning is
:func:`finecap.inference.caption_images` (what ``finecap caption --images`` runs), scoring is
:func:`finecap.metrics.suite.evaluate` (what ``finecap eval`` runs).

Example (a tiny random BLIP saved as a captioner; a trained run directory is loaded the same way)::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> from finecap.models.blip import Blip
    >>> from finecap.models.presets import save_tiny_blip
    >>> tmp = Path(tempfile.mkdtemp())
    >>> _ = Blip.from_pretrained(save_tiny_blip(tmp / "blip")).save(tmp / "model")
    >>> cap = Captioner.from_pretrained(tmp / "model", device="cpu")
    >>> Image.new("RGB", (40, 30), "red").save(tmp / "red.png")
    >>> captions = cap.caption([tmp / "red.png", Image.new("RGB", (40, 30), "blue")], max_length=5)
    >>> len(captions), all(isinstance(c, str) for c in captions)
    (2, True)
    >>> captions[0] == cap.caption(Image.open(tmp / "red.png"), max_length=5)[0]  # a file or its PIL image: alike
    True
    >>> round(evaluate(["a red circle"], [["a red circle", "a big red circle"]], metrics="bleu")["BLEU-1"], 6)
    1.0
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from finecap.library_warnings import silenced
from finecap.utils.closing import Closeable
from finecap.utils.once import said_afresh

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from finecap.config import Config

__all__ = ["Captioner", "evaluate", "train"]

F = TypeVar("F", bound=Callable[..., Any])


def checked_keywords(where: str, elsewhere: Callable[[str, Sequence[str]], str] | None = None) -> Callable[[F], F]:
    """A decorator: a call of the decorated function given a keyword it does not take is the ``TypeError`` of
    :func:`unknown_keyword`, naming the call ``where`` (``"finecap.evaluate"``) and the closest of its keywords, before
    the function runs. For the entries of the Python API whose keywords are fixed (:func:`evaluate`,
    :meth:`Captioner.from_pretrained`, the constructor); :func:`train` and :meth:`Captioner.caption` take options as
    keywords and say so themselves. ``elsewhere(name, keywords)``: where a keyword belongs instead, given the
    function's own ``keywords``, said in its place (the hint of :func:`unknown_keyword`; ``""`` for none):
    :func:`_caption_keyword_hint` for :meth:`Captioner.from_pretrained`.
    ``inspect.signature`` and ``help`` still show the function's own signature."""

    def decorate(func: F) -> F:
        taken = [p.name for p in inspect.signature(func).parameters.values()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self", "cls")]  # fmt: skip

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for name in kwargs:
                if name not in taken:
                    hint = elsewhere(name, taken) if elsewhere is not None else ""
                    raise unknown_keyword(name, where, taken, options=False, hint=hint)
            return func(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


def _caption_arguments() -> list[str]:
    """The keywords of :meth:`Captioner.caption` (and :meth:`Captioner.caption_all`) that are no decoding option:
    ``progress``, ``seed``."""
    return [p.name for p in inspect.signature(Captioner.caption).parameters.values() if p.kind is p.KEYWORD_ONLY]


def _caption_keyword_hint(name: str, own: Sequence[str] = ()) -> str:
    """`` (...)``: where the keyword ``name`` given to :meth:`Captioner.from_pretrained` belongs when it is one of
    :meth:`Captioner.caption`'s: a decoding option (a key of the ``decode`` section: ``max_length``, ``beam_size``),
    one of its own arguments (``seed``), or a Hugging Face name of a decoding option (``num_beams``:
    :data:`~finecap.config.hf_names.HF_NAMES`), with the call that takes it; else, for a name close to one of them
    and to none of the loader's ``own`` keywords (``devce``: ``device``, which :func:`unknown_keyword` suggests), that
    one (``max_lenght``: ``max_length``, :func:`finecap.utils.text.closest`); ``""`` for any other name. Loading takes
    no decoding settings: the checkpoint's ``decode`` section is the default, and each call replaces some of them.

    Example::

        >>> _caption_keyword_hint("max_length")
        ' (max_length is a decoding option of caption() and caption_all(), not of loading: \
captioner.caption(images, max_length=...))'
        >>> _caption_keyword_hint("num_beams").endswith("captioner.caption(images, beam_size=...))")
        True
        >>> _caption_keyword_hint("max_lenght")
        ' (did you mean max_length, a decoding option of caption() and caption_all(), not of loading? \
captioner.caption(images, max_length=...))'
        >>> _caption_keyword_hint("devce", ["path", "device"]), _caption_keyword_hint("learning_rate")
        ('', '')
    """
    from finecap.config import SECTIONS
    from finecap.config.hf_names import HF_NAMES, hf_hint
    from finecap.utils.text import closest

    fields = [f.name for f in dataclasses.fields(SECTIONS["decode"])]
    arguments = _caption_arguments()

    def what(key: str) -> str:
        return f"{'a decoding option' if key in fields else 'an argument'} of caption() and caption_all()"

    if name in fields or name in arguments:
        return f" ({name} is {what(name)}, not of loading: captioner.caption(images, {name}=...))"
    hf = HF_NAMES.get(name)
    if hf is None and closest(name, own) is None and (match := closest(name, [*fields, *arguments])) is not None:
        return f" (did you mean {match}, {what(match)}, not of loading? captioner.caption(images, {match}=...))"
    if hf is None or (hf.key is not None and not hf.key.startswith("decode.")):
        return ""
    said = hf_hint(name, spell=lambda option: option.removeprefix("decode."))
    if hf.key is None:  # a generate() name finecap has no counterpart of
        return said
    key = hf.key.removeprefix("decode.")
    call = f"{key}={hf.value!r}" if hf.value else f"{key}=..."
    return (f"{said[:-1]}; a decoding option of caption() and caption_all(), not of loading: "
            f"captioner.caption(images, {call}))")  # fmt: skip


class Captioner(Closeable):
    """A trained captioner for notebooks: :meth:`from_pretrained` loads a checkpoint, :meth:`caption` captions images.

    Attributes: ``model`` (the finecap captioner, a ``torch.nn.Module`` in evaluation mode), ``cfg`` (the
    configuration stored with the checkpoint, or the defaults for a bare model folder: its ``decode`` section gives the
    default decoding settings, its ``train.mixed_precision`` the autocast), ``checkpoint`` (the folder loaded).
    ``with Captioner.from_pretrained(path) as captioner:`` calls :meth:`close` on leaving the block. The constructor,
    ``Captioner(model, cfg, checkpoint)``, wraps a captioner already loaded; ``Captioner(path)`` is a ``TypeError``
    naming ``Captioner.from_pretrained(path)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Captioner:
        # Captioner(path), the mistake of loading with the constructor, was Python's "missing 1 required positional
        # argument: 'cfg'", which said nothing of from_pretrained (checked here: __init__'s arguments are bound after)
        given = args[0] if args else kwargs.get("model")
        # a subclass with a constructor of its own (one taking a path, say) is not checked: its __init__ decides
        if cls.__init__ is Captioner.__init__ and isinstance(given, str | os.PathLike):
            path = os.fspath(given)
            raise TypeError(f"Captioner({path!r}): a checkpoint loads with Captioner.from_pretrained({path!r}) (a run "
                            "directory, a checkpoint or model folder; device=... where it goes); Captioner(model, "
                            "cfg) wraps a captioner already loaded and its finecap.config.Config")  # fmt: skip
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # the signature set below (Captioner's __init__, not __new__'s checks) is inherited; a subclass with a
        # constructor of its own shows its own (None: inspect reads the class's __new__ / __init__ again)
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__ or "__new__" in cls.__dict__:
            cls.__signature__ = None  # type: ignore[attr-defined]

    @checked_keywords("Captioner")
    def __init__(self, model: Any, cfg: Config, checkpoint: Path | None = None) -> None:
        """Wrap ``model`` (a loaded finecap captioner) with ``cfg``, its configuration, and ``checkpoint``, the
        folder it came from; :meth:`from_pretrained` calls it. A path given as ``model`` (``Captioner("runs/x")``)
        is a ``TypeError`` naming ``Captioner.from_pretrained("runs/x")``, which loads one."""
        self.model, self.cfg, self.checkpoint = model, cfg, checkpoint
        self._engine: Any = None  # the generation engine (decode.engine), opened on first use (:meth:`close` frees it)

    @classmethod
    # devce="cpu": Python's TypeError suggested nothing; max_length=5 is caption()'s (_caption_keyword_hint)
    @checked_keywords("Captioner.from_pretrained", elsewhere=_caption_keyword_hint)
    @said_afresh()  # a command of its own: its notes said as in a fresh process (finecap.utils.once)
    def from_pretrained(cls, path: str | os.PathLike[str], *, device: str | torch.device | None = None) -> Captioner:
        """Load the captioner of ``path``: a run directory (its best checkpoint, else its last), a checkpoint folder
        (``RUN/checkpoints/best``), its ``model/`` folder, or a bare model folder (a captioner's ``save``); any other
        folder is a ``FileNotFoundError`` naming the folder to pass (:func:`finecap.runs.find_checkpoint`). A relative
        ``path`` not in the working directory is looked for under the runs root, as ``finecap caption --checkpoint``
        does (:func:`finecap.inference.checkpoint_where`): ``from_pretrained("demo/mle")`` is the run that
        ``finecap.train("demo/mle")`` wrote.

        The checkpoint's own configuration (``config.yaml``) gives the model's load options (dtype, quantization),
        the decoding settings and the autocast, as ``finecap caption`` uses them. Its recorded fingerprint of the
        vision encoder is checked (:func:`finecap.train.fingerprint.check_run`), and weights holding NaN are refused.
        ``device``: default the machine's accelerator (a GPU) unless the run set ``train.cpu``, else the CPU
        (:func:`finecap.models.memory.eval_device`); one torch does not know or this machine lacks is a
        ``ValueError`` naming it (:func:`usable_device`), before the model loads. An empty ``path`` (``""``, which
        ``pathlib`` reads as the working directory) is a ``ValueError``: ``"."`` names that folder. Loading leaves the
        process's random generators (python, numpy, torch) as they were: a notebook's draws after it are those it
        would have had without it. A run still training swaps no new ``best`` in while its checkpoint is read
        (:func:`finecap.runs.reading_checkpoint`): the configuration and the weights are one save's."""
        with silenced():  # the libraries' warnings the CLI leaves out (finecap.library_warnings), imports included
            from finecap.config import load_stored
            from finecap.inference import checkpoint_where, load_for_captioning
            from finecap.models.memory import eval_device
            from finecap.runs import model_dir, reading_checkpoint, stored_config
            from finecap.train.checkpoint import folder_config
            from finecap.train.fingerprint import check_run
            from finecap.utils.rng import rng_preserved

            _refuse_empty_path(path, "Captioner.from_pretrained", 'a run directory, a checkpoint folder or a model '
                               'folder ("." is the working directory)')  # fmt: skip
            where = usable_device(device) if device is not None else None  # a wrong device said before any reading
            # a run name as --checkpoint takes it; its configuration and weights one save's, never a best swapped in
            with reading_checkpoint(checkpoint_where(path, option="path")) as checkpoint:
                stored = stored_config(checkpoint)
                cfg = load_stored(stored) if stored is not None else folder_config(model_dir(checkpoint))
                check_run(checkpoint, cfg, parts=["captioner"], model_folder=model_dir(checkpoint))
                with rng_preserved():  # building the modules draws their initial weights from torch's generator
                    model = load_for_captioning(checkpoint, cfg, where if where is not None else eval_device(cfg))
        return cls(model, cfg, checkpoint)

    @property
    def device(self) -> torch.device:
        """Where the model is (and where images are decoded)."""
        return self.model.device

    def caption(
        self,
        images: Image.Image | str | os.PathLike[str] | Sequence[Image.Image | str | os.PathLike[str]],
        *,
        progress: bool = False,
        seed: int | None = None,
        **decode: Any,
    ) -> list[str]:
        """One caption per image of ``images`` (a PIL image or an image file's path, or a list of them), in order; a
        numpy array or a torch tensor is a ``TypeError`` (``PIL.Image.fromarray`` of an H x W x 3 uint8 array makes
        its image). A folder is a :class:`finecap.data.records.DataError` saying how to caption its images: the
        captions are a list in the order of ``images``, which a folder does not give, so its images are listed first
        as ``finecap caption --images FOLDER`` lists them (:func:`finecap.inference.image_files`: sorted, below it,
        hidden files left out), each with its file and image id: ``files = [f.path for f in image_files([folder])]``
        then ``captioner.caption(files)``, caption ``i`` for ``files[i]``.

        ``decode``: keys of the ``decode`` section replacing the checkpoint's (``strategy="beam"``, ``beam_size=3``,
        ``max_length=20``, ``batch_size=64``, ``engine="vllm"`` for a VLM served by vLLM, ...;
        :class:`finecap.config.DecodeConfig`). Images go in batches of
        ``decode.batch_size`` sequences on :attr:`device`, under the run's autocast
        (:func:`finecap.inference.caption_images`). A file that does not decode as an image is a
        :class:`finecap.data.records.DataError` naming it. ``progress``: show a progress bar. For several captions
        per image (``num_return_sequences``), use :meth:`caption_all`. A file and its PIL image give the same pixels
        but for a JPEG at least twice the processor's size: its file is decoded at a reduced scale (the JPEG draft
        training's feature cache used, ``data.jpeg_draft``), an already decoded PIL image at full size. Greedy decoding
        and beam search leave torch's random generator as they found it. Sampling draws from it (``torch.manual_seed``
        before the call repeats its captions; another ``batch_size`` gives other ones), or, given ``seed``, from
        per-image seeds of ``seed`` and the image's place in ``images``, as ``finecap caption`` samples with
        ``run.seed``: ``seed=captioner.cfg.run.seed`` gives the command's captions, in any ``batch_size``, and leaves
        torch's generator alone (:func:`finecap.caption.batch_captions`)."""
        settings = self.decode_settings(**decode)
        if settings.num_return_sequences != 1:
            raise ValueError("caption() returns one caption per image; for num_return_sequences="
                             f"{settings.num_return_sequences} use caption_all()")  # fmt: skip
        return [caps[0] for caps in self.caption_all(images, progress=progress, seed=seed, **decode)]

    def caption_all(
        self,
        images: Image.Image | str | os.PathLike[str] | Sequence[Image.Image | str | os.PathLike[str]],
        *,
        progress: bool = False,
        seed: int | None = None,
        **decode: Any,
    ) -> list[list[str]]:
        """:meth:`caption`, with every caption decoded per image (``num_return_sequences`` of them: the beams or
        samples), best first for beam search."""
        from finecap.data.images import ImageLimits
        from finecap.data.loading import encoder_draft
        from finecap.inference import caption_images

        _check_flag("progress", progress)
        images = _as_list(images)
        if not images:
            return []
        settings = self.decode_settings(**decode)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):  # any int, as run.seed
            raise TypeError(f"seed: expected an integer (run.seed's per-image sampling seeds), got {seed!r}")
        with silenced():
            result = caption_images(self.generator(settings), images, settings,
                                    mixed_precision=self.cfg.train.mixed_precision, progress=progress,
                                    limits=ImageLimits.of(self.cfg.data), seed=seed,
                                    draft=encoder_draft(self.model.encoder, self.cfg.data))  # fmt: skip
        return [caps for caps in result.captions if caps is not None]  # none skipped: bad images raise

    def generator(self, settings: Any) -> Any:
        """The generation engine that decodes with the decoding ``settings`` (their ``engine``:
        :func:`finecap.engines.open_engine`), opened on first use with the checkpoint's configuration (its ``vllm``
        section) and kept for later calls with the same engine; :meth:`close` frees it."""
        from finecap.engines import engine_class, open_engine

        if not isinstance(self._engine, engine_class(settings)):
            self.close()
            self._engine = open_engine(dataclasses.replace(self.cfg, decode=settings), self.model)
        return self._engine

    def close(self) -> None:
        """Free the generation engine if one was opened (a vLLM engine's memory); the model stays. The engine is
        dropped even when its ``close`` raises (the error raised here): a later call opens another."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def decode_settings(self, **decode: Any) -> Any:
        """The checkpoint's decoding settings (``cfg.decode``) with ``decode`` replacing some, each converted and
        checked as a recipe's value (``max_length="5"`` or ``5.7`` is a ``ConfigError`` naming ``decode.max_length``);
        an unknown key is a ``ValueError`` listing the valid ones and :meth:`caption`'s own keywords (``progress``,
        ``seed``: a misspelt one, ``progres=True``, is suggested as it, not as a decoding option), and saying so when
        it is an argument of :meth:`from_pretrained` instead (``device``: where the model is loaded, not a decoding
        setting); a Hugging Face name is told what it is here (``num_beams``: ``beam_size``, with
        ``decode.strategy=beam``: :data:`~finecap.config.hf_names.HF_NAMES`)."""
        from finecap.config import did_you_mean, replaced_section
        from finecap.config.hf_names import hf_hint
        from finecap.utils.text import closest

        fields = [f.name for f in dataclasses.fields(self.cfg.decode)]
        loading = set(inspect.signature(Captioner.from_pretrained).parameters)
        own = _caption_arguments()
        for key in decode:
            if key not in fields:
                hint = hf_hint(key, spell=lambda option: option.removeprefix("decode.")) or did_you_mean(key, fields)
                if not hint and (match := closest(key, own)) is not None:
                    hint = f" (did you mean {match!r}? an argument of caption() and caption_all())"
                if key in loading:
                    hint = (f" ({key} is an argument of Captioner.from_pretrained, which loads the model: "
                            f"Captioner.from_pretrained(path, {key}=...))")  # fmt: skip
                raise ValueError(f"unknown decoding option {key!r}{hint}; valid: {', '.join(fields)} (and caption()'s "
                                 f"own {' and '.join(own)})")  # fmt: skip
        return replaced_section(self.cfg.decode, "decode", **decode)


# help(Captioner) and inspect show __init__'s arguments, not the (*args, **kwargs) of the __new__ that checks them
_INIT = inspect.signature(Captioner.__init__)
Captioner.__signature__ = _INIT.replace(  # type: ignore[attr-defined]
    parameters=list(_INIT.parameters.values())[1:], return_annotation=inspect.Signature.empty
)


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` that can hold the weights here; a name torch does not know (``"gpu"``), the
    meta device (no weights) or one this machine lacks (``"cuda"`` without a GPU or a CUDA build of torch,
    ``"cuda:3"`` with two GPUs, as ``torch.accelerator`` tells) is a ``ValueError`` naming ``device`` and why (torch
    said it as an ``AssertionError`` or a ``RuntimeError`` once the weights were read)."""
    import torch

    index = isinstance(device, int) and not isinstance(device, bool)  # an accelerator's index, as torch reads it
    if index and not torch.accelerator.is_available():  # torch: "Cannot access accelerator device when none is ..."
        raise ValueError(f"device={device!r}: not usable on this machine (an integer names an accelerator, and it has "
                         "no accelerator torch can use); pass 'cpu'")  # fmt: skip
    if not (index or isinstance(device, (str, torch.device))):  # torch's TypeError lists its overloads
        raise ValueError(f"device={device!r}: not a device torch knows (expected 'cpu', 'cuda:0', ..., a torch.device "
                         f"or an accelerator's index, got {type(device).__name__})")  # fmt: skip
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r}: not a device torch knows ({e})") from None
    if found.type == "meta":
        raise ValueError(f"device={device!r}: the meta device holds no weights; pass 'cpu' or an accelerator")
    if found.type == "cpu":
        return found
    # torch.accelerator's answers, not an allocation there (which would start the device's context before the
    # weights are read, and which a test's mocked accelerator cannot make)
    here = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if here is None or here.type != found.type:
        why = f"its accelerator is {here.type}" if here is not None else "it has no accelerator torch can use"
        raise ValueError(f"device={device!r}: not usable on this machine ({why})")
    count = torch.accelerator.device_count()
    if found.index is not None and found.index >= count:
        raise ValueError(f"device={device!r}: not usable on this machine (it has {count} {found.type} device(s))")
    return found


def _check_flag(name: str, value: Any) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` is ``True`` or ``False``: any non-empty string is truthy, so
    ``overwrite="no"`` replaced the run it was meant to keep and ``progress="no"`` drew a bar."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _is_image_or_path(item: Any) -> bool:
    return isinstance(item, str | os.PathLike) or hasattr(item, "getpixel")  # a path, or a PIL image


_ARRAY_HINT = ("; an array's scale (0..1 or 0..255) and channel order are not known here: pass "
              "PIL.Image.fromarray(a) of an H x W x 3 uint8 array")  # fmt: skip
"""What a ``TypeError`` of :func:`_as_list` adds for a numpy array or a torch tensor."""


def _what(item: Any) -> str:
    """The type of ``item`` as the errors of :func:`_as_list` name it (with :data:`_ARRAY_HINT` for an array)."""
    return type(item).__name__ + (_ARRAY_HINT if hasattr(item, "__array__") else "")


def _refuse_empty_path(value: Any, where: str, expected: str) -> None:
    """A ``ValueError`` ``<where>: an empty path (""); name <expected>`` when ``value`` is the empty string, which
    ``pathlib`` reads as the working directory (``Path("") == Path(".")``): an image there is "a folder", a recipe
    there "is a directory", and a run or checkpoint there would be used, though ``""`` names nothing."""
    if isinstance(value, str) and not value:
        raise ValueError(f'{where}: an empty path (""); name {expected}')


def _as_list(images: Any) -> list[Any]:
    """One image (a PIL image, a path) as a list of one; a list or tuple of them as a list; anything else (bytes, a
    number, a nested list, a numpy array or torch tensor) a ``TypeError`` naming the item, an empty path (``""``,
    which reads as the working directory) a ``ValueError``, a folder a ``DataError`` (:func:`_refuse_folder`)."""
    items = [images] if _is_image_or_path(images) else None
    if items is None and isinstance(images, Sequence) and not isinstance(images, bytes | bytearray):
        items = list(images)
    if items is None:
        raise TypeError(f"images: expected a PIL image, a path, or a list of them, got {_what(images)}")
    for i, item in enumerate(items):
        if not _is_image_or_path(item):
            raise TypeError(f"images[{i}]: expected a PIL image or a path, got {_what(item)}")
        _refuse_empty_path(item, f"images[{i}]", "an image file")
        _refuse_folder(item, f"images[{i}]")
    return items


def _refuse_folder(item: Any, where: str) -> None:
    """A :class:`~finecap.data.records.DataError` ``<where>: <item> is a folder; ...`` when the path ``item`` is a
    folder, saying how to caption its images: :func:`finecap.inference.image_files` lists them as ``finecap caption
    --images FOLDER`` does (it said "cannot read image: a folder" once the images before it were decoded)."""
    if isinstance(item, str | os.PathLike) and Path(item).is_dir():
        from finecap.data.records import DataError

        folder = os.fspath(item)
        raise DataError(f"{where}: {folder} is a folder; caption() takes image files and PIL images, one caption "
                        "each in order. A folder's images, as finecap caption --images lists them (sorted, below it, "
                        "hidden files left out): files = [f.path for f in finecap.inference.image_files("
                        f"[{folder!r}])]; captioner.caption(files)")  # fmt: skip


@checked_keywords("finecap.evaluate")  # metric="bleu": Python's TypeError suggested nothing
@said_afresh()
def evaluate(
    predictions: Sequence[str] | Mapping[Hashable, str],
    references: Sequence[Sequence[str] | str] | Mapping[Hashable, Sequence[str] | str] | None = None,
    *,
    metrics: str | Sequence[str] | None = None,
    cfg: Config | None = None,
) -> dict[str, float]:
    """Corpus scores of ``predictions`` against ``references``: ``{metric: value}``, e.g. ``{"BLEU-4": ...,
    "CIDEr-D": ...}``, computed by finecap's metric suite (:func:`finecap.metrics.suite.evaluate`; equal to
    pycocoevalcap's: PTB-tokenised, lower-cased).

    Accepted forms:

    - ``predictions``: a list of captions (one per image, ``str``), or a mapping ``{image_id: caption}``;
    - ``references``: with a list of predictions, a list of the same length whose items are each image's reference
      captions (a list of ``str``, or one ``str``); with a mapping, a mapping ``{image_id: [reference, ...]}`` holding
      every predicted id (extra ids are ignored; an int id and its string name one image, so predictions, or
      references, for both are a ``ValueError``; ``"007"`` is no spelling of ``7``:
      :func:`finecap.data.records.id_key`).
      ``None`` for the metrics that need none (``length``, ``vocab``).
    - ``metrics``: metric group names (``"bleu,cider"`` or a list; :data:`finecap.metrics.suite.METRICS`, or a dotted
      path to your own :class:`~finecap.metrics.group.MetricGroup`). Default,
      with references: pycocoevalcap's five, ``bleu``, ``meteor``, ``rouge``, ``cider``, ``spice``, leaving out
      METEOR and SPICE where they cannot run here (METEOR: pycocoevalcap's data; SPICE: Java and its jars); without:
      ``length`` and ``vocab``.
      Image metrics (CLIPScore, self-retrieval) need images: use ``finecap eval`` or the suite.
    - ``cfg``: the configuration of ``eval.*`` (default: the library defaults); its ``eval.metrics``, when set, are
      the groups computed without ``metrics``, as ``finecap eval`` computes a recipe's.

    A group asked for by name (``metrics``, or ``cfg``'s ``eval.metrics``) that cannot run here (METEOR or SPICE
    without what they need) is a ``ValueError`` saying what is missing, as ``finecap eval --metrics`` exits 2; only the
    default set leaves such groups out.

    Example::

        >>> evaluate({1: "a red circle", 2: "a blue square"}, {1: ["a red circle"], 2: "a blue square"},
        ...          metrics=["bleu", "length"])["Length"]
        3.0
    """
    from finecap.config import Config
    from finecap.metrics import suite

    # a recipe's name or a dict of sections: it was AttributeError "'str' object has no attribute 'eval'"
    if cfg is not None and not isinstance(cfg, Config):
        raise TypeError(f"cfg: expected a finecap.config.Config (finecap.config.load(RECIPE) reads a recipe), got "
                        f"{type(cfg).__name__}")  # fmt: skip
    preds, refs = _aligned(predictions, references)
    if metrics is None and not (cfg is not None and cfg.eval.metrics):
        return suite.evaluate(preds, refs, metrics=default_metrics(refs is not None, cfg), cfg=cfg)
    option = "metrics" if metrics is not None else "eval.metrics"
    names = suite.parse_metrics(metrics, cfg.eval.metrics if cfg is not None else (), option=option)
    for name in names:  # asked for by name: one that cannot run here is an error, as finecap eval's (not skipped)
        reason = suite.unavailable_reason(name, cfg)
        if reason:
            raise ValueError(f"{option}: metric {name!r} cannot run here: {reason}")
    return suite.evaluate(preds, refs, metrics=names, cfg=cfg)


def default_metrics(references: bool, cfg: Config | None = None) -> list[str]:
    """The metric groups :func:`evaluate` computes when none are named: with ``references`` pycocoevalcap's five
    (:data:`finecap.metrics.suite.CAPTION_METRICS`) less METEOR and SPICE where they cannot run here
    (:func:`finecap.metrics.suite.unavailable_reason`, with ``cfg``'s ``eval.meteor_backend``), else the text
    statistics ``length`` and ``vocab``."""
    from finecap.metrics import suite

    if not references:
        return ["length", "vocab"]
    return [m for m in suite.CAPTION_METRICS if suite.unavailable_reason(m, cfg) is None]


def _aligned(predictions: Any, references: Any) -> tuple[dict[Hashable, str], dict[Hashable, list[str]] | None]:
    """``predictions`` and ``references`` (the forms :func:`evaluate` accepts) as ``{id: caption}`` and
    ``{id: [references]}``; a list is numbered from 0."""
    if isinstance(predictions, str) or not isinstance(predictions, Sequence | Mapping):
        raise TypeError(f"predictions: expected a list of captions or a dict {{image_id: caption}}, got "
                        f"{type(predictions).__name__}")  # fmt: skip
    preds = dict(predictions) if isinstance(predictions, Mapping) else dict(enumerate(predictions))
    bad = [i for i, c in preds.items() if not isinstance(c, str)]
    if bad:
        raise TypeError(f"predictions: one caption (str) per image; image {bad[0]!r} has a "
                        f"{type(preds[bad[0]]).__name__}")  # fmt: skip
    if references is None:
        return preds, None
    if isinstance(references, Mapping) != isinstance(predictions, Mapping) or isinstance(references, str):
        raise TypeError("references: give a list (aligned with a list of predictions) or a dict {image_id: "
                        "[references]} (with a dict of predictions)")  # fmt: skip
    if not isinstance(references, Mapping):
        if not isinstance(references, Sequence):
            raise TypeError(f"references: expected a list or a dict, got {type(references).__name__}")
        if len(references) != len(preds):
            raise ValueError(f"references: {len(references)} items for {len(preds)} predictions (one list of "
                             "references per prediction, in the same order)")  # fmt: skip
        references = dict(enumerate(references))
    refs: dict[Hashable, list[str]] = {}
    for i, r in references.items():
        texts = [r] if isinstance(r, str) else list(r) if isinstance(r, Sequence) else None
        odd = [t for t in texts or () if not isinstance(t, str)]
        if texts is None or odd:
            what = type(r).__name__ + (f" holding a {type(odd[0]).__name__}" if odd else "")
            raise TypeError(f"references of image {i!r}: expected a list of captions (str) or one caption, got {what}")
        refs[i] = texts
    from finecap.data.records import id_key, refuse_repeated_ids

    # {1: ..., "1": ...}: one image twice (it was read as "no references for '1'"), refused as finecap eval does
    refuse_repeated_ids(refs, "references")  # first, as the data readers refuse such references before eval
    refuse_repeated_ids(preds, "predictions")
    aligned: dict[Hashable, str] = {}
    for i, caption in preds.items():  # an id given as an int on one side, as its string on the other: one image
        key = id_key(i, refs)
        aligned[key if key is not None and key not in preds else i] = caption
    return aligned, refs


def _path_as_text(value: Any) -> Any:
    """A keyword's value as a recipe holds it: a path (``pathlib.Path``, any ``os.PathLike``) as its text, in a list
    too (``run__dir=tmp / "run"`` is ``run.dir=<tmp>/run``; a path was refused as "expected a string")."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple) and any(isinstance(v, os.PathLike) for v in value):
        return [_path_as_text(v) for v in value]
    return value


KEYWORDS = "finecap.train keywords: "
"""Where an error says a keyword override of :func:`train` was set."""


def _run_config(run_dir: str | os.PathLike, over: dict[str, Any], *, resume: bool, error: ValueError) -> Config:
    """The configuration of ``finecap.train(run_dir, resume=True, **keywords)``: the run's own settings with the
    keywords ``over`` on top (:func:`finecap.config.stored.resume_config`, what ``finecap train --resume --out RUN``
    reads). Without ``resume`` the folder is no recipe: a :class:`finecap.config.ConfigError` (``error``'s message)
    saying how to continue it; a ``run__dir`` keyword is a ``TypeError`` (the run resumes in its own folder)."""
    from finecap.config import ConfigError
    from finecap.config.stored import resume_config

    asked = f"finecap.train({os.fspath(run_dir)!r}, resume=True)"
    if not resume:
        from finecap.runs import CONFIG_FILE

        held = (Path(run_dir) / CONFIG_FILE).is_file()
        raise ConfigError(f"{error}" + (f"; {asked} continues the run there with its own settings" if held else ""))
    if isinstance(over.get("run"), dict) and "dir" in over["run"]:
        raise TypeError(f"{asked}: run__dir is not taken: the run resumes in its own folder (to train from its "
                        "checkpoint elsewhere: its recipe with train__init_from=<run>/checkpoints/last)")  # fmt: skip
    return resume_config(run_dir, over=over, over_source=KEYWORDS, asked=asked,
                         with_recipe="finecap.train(RECIPE, resume=True, run__dir=RUN)")  # fmt: skip


OWN_KEYWORDS = ("resume", "overwrite")
"""The keywords of :func:`train` that are no option (``section__key``) of the configuration."""


def _as_keyword(option: str) -> str:
    """An option ``section.key`` as a keyword of :func:`train`: ``train__max_steps``."""
    return option.replace(".", "__")


def unknown_keyword(name: str, where: str = "finecap.train", own: Sequence[str] = OWN_KEYWORDS,
                    options: bool = True, hint: str = "") -> TypeError:  # fmt: skip
    """The error of a call of the Python API given a keyword ``name`` it does not take: ``where`` names the call and
    ``own`` its keywords, the closest of which is suggested (``overwrte`` -> ``overwrite``; with
    :func:`checked_keywords`, ``finecap.evaluate(..., metric="bleu")`` -> ``metrics`` and
    ``Captioner.from_pretrained(path, devce="cpu")`` -> ``device``, where Python's own ``TypeError`` suggested none).

    ``options``: the call also takes the configuration's options as ``section__key`` keywords (:func:`train`, the
    default), so a keyword that is neither one of ``own`` nor written ``section__key`` is told the options of that name
    first (``max_steps`` -> ``train__max_steps``; ``preset`` -> ``retriever__preset``, not the keyword ``resume`` it is
    close to), then the closest of ``own``, else what a Hugging Face name is here (``learning_rate`` -> ``train__lr``:
    :data:`~finecap.config.hf_names.HF_NAMES`), else the closest option (``train_max_steps`` -> ``train__max_steps``),
    and how an option is written. It said only the last, so a misspelt ``overwrite`` read as a malformed option.

    ``hint``: where the keyword belongs instead (`` (...)``, :func:`checked_keywords`' ``elsewhere``), said in place
    of a suggestion when not empty.

    Example::

        >>> print(unknown_keyword("metric", "finecap.evaluate", ("predictions", "references", "metrics", "cfg"),
        ...                       options=False))
        finecap.evaluate: unexpected keyword 'metric' (did you mean 'metrics'?); its keywords are predictions, \
references, metrics and cfg
    """
    from finecap.config import SECTIONS
    from finecap.config.fields import option_fields
    from finecap.config.hf_names import hf_hint
    from finecap.config.loading import either, options_named
    from finecap.utils.text import closest

    if hint:  # where it belongs, said by the caller
        pass
    elif options and (named := options_named(name)):  # an option's very name (preset) is no misspelt keyword (resume)
        hint = f" (did you mean {either([_as_keyword(key) for key in named])}?)"
    elif (match := closest(name, own)) is not None:
        hint = f" (did you mean {match!r}?)"
    elif options and (hf := hf_hint(name, spell=_as_keyword)):
        hint = hf
    elif options:
        every = [_as_keyword(key) for s, cls in SECTIONS.items() for key, _, _ in option_fields(cls, f"{s}.")]
        option = closest(name, every)
        hint = f" (did you mean {option!r}?)" if option is not None else ""
    listed = " and ".join(own) if len(own) <= 2 else f"{', '.join(own[:-1])} and {own[-1]}"
    if not options:
        return TypeError(f"{where}: unexpected keyword {name!r}{hint}; its keywords are {listed}")
    return TypeError(f"{where}: unexpected keyword {name!r}{hint}; its own keywords are {listed}, and an option is "
                     "written section__key=value (e.g. train__max_steps=2, "
                     "data__hf__caption_column='sentences')")  # fmt: skip


def more_positionals(more: tuple[Any, ...]) -> TypeError:
    """The error of ``finecap.train(recipe, <more>)``: the recipe (or configuration) is its one positional argument,
    and overrides are keywords, a dict of them unpacked (``**{"train__max_steps": 2}``), not a dict or a list of the
    command line's ``key=value`` passed beside the recipe."""
    given = ", ".join(type(m).__name__ for m in more)
    return TypeError(f"finecap.train takes one positional argument, the recipe or a Config, got {len(more)} more "
                     f"({given}); overrides are keywords: finecap.train(recipe, train__max_steps=2), a dict of them "
                     "unpacked: finecap.train(recipe, **overrides)")  # fmt: skip


@said_afresh()
def train(recipe_or_config: str | os.PathLike | Config, /, *, resume: bool = False, overwrite: bool = False,
          **overrides: Any) -> Path:  # fmt: skip
    """Train a captioner as ``finecap train`` does; returns the run directory (``run.dir``, or its default under the
    runs root: :func:`finecap.home.run_path`).

    Args:
        recipe_or_config: a recipe (a YAML file, or a packaged recipe by name: ``"demo/mle"``) or a
            :class:`finecap.config.Config` (checked as a loaded recipe is, keywords or not: a registry name or a
            ``train.best_metric`` no validator gives is a :class:`finecap.config.ConfigError` before anything is
            made); with ``resume=True``, a run directory too (a folder, which no packaged recipe's name takes:
            ``"./demo/mle"`` is the folder, ``"demo/mle"`` the recipe). An empty one (``""``, which ``pathlib``
            reads as the working directory) is a ``ValueError`` before anything is read: ``"."`` names that folder.
        resume: continue from the run directory's newest complete checkpoint (``finecap train --resume``). Given a
            run directory, ``finecap.train(run_dir, resume=True, **overrides)`` is ``finecap train --resume --out
            RUN [key=value ...]``: the settings the run was trained with (its ``config.yaml``), the keywords on top,
            refused as the command refuses them (a folder without a ``config.yaml`` or whose file finecap did not
            write, a change of what cannot change on resume, a run another process trains) and trained as it trains
            (the same steps, logs and weights). It is ``train``'s ``resume`` flag rather than a function of its own
            because it is the command's: ``finecap train --resume``. ``run__dir`` is a ``TypeError`` there: the run
            resumes in its own folder.
        overwrite: replace a finished run in the run directory (otherwise an existing run is an error). ``resume``
            and ``overwrite`` are ``True`` or ``False``; anything else (``overwrite="no"``) is a ``TypeError``.
        overrides: settings above the recipe, one keyword per option, the section and the key joined by a double
            underscore and the value a Python value: ``train__max_steps=2``, ``run__dir="runs/x"``,
            ``rl__rewards={"cider": 1.0}`` (what ``train.max_steps=2`` ... are on the command line); a path
            (``pathlib.Path``) is its text (``run__dir=tmp / "run"``). They are checked
            as the command line's are: an unknown key is a :class:`finecap.config.ConfigError` naming the closest; a
            keyword that is neither ``resume``, ``overwrite`` nor ``section__key`` a ``TypeError`` naming the one
            meant (:func:`unknown_keyword`: ``overwrte``, ``max_steps``, ``train_lr``).

    The run seeds the process's random generators (python, numpy, torch) with ``run.seed`` as ``finecap train``
    does; afterwards they are as the caller left them, and so are accelerate's per-process state (none when the
    caller had none: the next run is set up for its own ``train.cpu``; a caller's own ``Accelerator`` keeps its
    device, precision and accumulation steps) and torch's TF32 flags (``train.tf32`` sets them on a GPU). accelerate
    holds one device per process, so a caller's own ``PartialState`` or ``Accelerator`` on another device than
    ``train.cpu`` asks for (``train__cpu=True`` after ``Accelerator()`` on a GPU) is a ``ValueError`` naming both,
    before anything is made (:func:`finecap.train.engine.check_callers_device`): the run trained on the caller's.
    Training runs with grad mode on and outside inference mode whatever the caller's. Each call says its notes (the
    images ``data.skip_bad_images`` leaves out, how unsplit data was split) as the command would in a fresh process
    (:mod:`finecap.utils.once`), not only the first call of the process.

    Example (two steps of the demo's MLE recipe; the first run in a finecap home makes the demo's world, 11,500
    images, and trains its world encoder before them: minutes on a CPU. docs/training.md's notebook example trains
    on a tiny world and a tiny CLIP in seconds)::

        run_dir = finecap.train("demo/mle", train__max_steps=2, run__dir="runs/notebook")
        cap = finecap.Captioner.from_pretrained(run_dir)
    """
    from finecap.config import Config, ConfigError, load
    from finecap.recipes import resolve_recipe

    for flag, value in (("resume", resume), ("overwrite", overwrite)):
        _check_flag(f"finecap.train: {flag}", value)
    _refuse_empty_path(recipe_or_config, "finecap.train", "a recipe (a YAML file or a packaged recipe's name, "
                       '"demo/mle") or, with resume=True, a run directory ("." is the working directory)')  # fmt: skip

    with silenced():  # the libraries' warnings the CLI and Captioner leave out (finecap.library_warnings)
        from finecap.train.run import train as train_run

    over: dict[str, Any] = {}
    # a table first, then the keys inside it (data__hf={...} and data__hf__caption_column=...: in any order, the key
    # set by name wins over the table's)
    for name, value in sorted(overrides.items(), key=lambda item: item[0].count("__")):
        *path, key = name.split("__")
        if not path or not all(path) or not key:
            raise unknown_keyword(name)
        node = over
        for part in path:  # a subsection's key (data__hf__caption_column) goes into its own table
            given = node.get(part, {})
            if not isinstance(given, dict):
                raise TypeError(f"finecap.train: {name!r} sets a key inside {part!r}, which is given a value itself")
            node[part] = node = dict(given)  # a copy: a table the caller gave is never changed
        node[key] = _path_as_text(value)
    if isinstance(recipe_or_config, Config):
        recipe = None
        # loaded again with or without keywords: a Config built in Python (dataclasses.replace) has only its
        # sections' own checks, not the load's (registry names, train.best_metric), which training met only after the
        # world and the run's config.yaml were made
        cfg = load(base=recipe_or_config.to_dict(), over=over, over_source=KEYWORDS)
    elif isinstance(recipe_or_config, str | os.PathLike):
        try:
            recipe = resolve_recipe(recipe_or_config)
        except ValueError as e:
            if not Path(recipe_or_config).is_dir():
                raise ConfigError(str(e)) from None
            recipe, cfg = None, _run_config(recipe_or_config, over, resume=resume, error=e)
        else:
            cfg = load(recipe, over=over, over_source=KEYWORDS)
    else:
        raise TypeError(f"finecap.train: a recipe (path or name) or a Config, got {type(recipe_or_config).__name__}")
    from finecap.train.engine import accelerate_state_kept, check_callers_device, tf32_kept
    from finecap.utils.rng import rng_preserved

    check_callers_device(cfg.train)  # a caller's accelerate state holds the process's device: train.cpu must agree

    # the caller's random generators, accelerate state and TF32 flags are theirs again afterwards (its grad mode:
    # train_run's)
    with silenced(), rng_preserved(), accelerate_state_kept(), tf32_kept():
        return train_run(cfg, resume=resume, overwrite=overwrite, recipe=recipe)
