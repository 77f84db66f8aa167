"""Loading a VLM's processor (``AutoProcessor``), also where ``transformers`` cannot build its video processor.

Without ``torchvision``, ``transformers`` cannot build the video processor that Qwen2-VL's processor class requires
(its class check and ``AutoVideoProcessor`` both need it), although captioning never touches videos:
:func:`load_processor` then builds the family's processor class without its video processor
(:func:`image_only_processor`). Such a processor still saves the video processor's settings (the source folder's,
:func:`video_settings`), so that ``AutoProcessor.from_pretrained`` reads the saved folder (a checkpoint, a merged
export, vLLM serving it) where ``torchvision`` is installed.

:data:`CLIPImageProcessor` is the class ``transformers.CLIPImageProcessor`` names: its ``torchvision`` backend where
``torchvision`` is installed, else its PIL backend ``CLIPImageProcessorPil``, which transformers falls back to with a
warning at the import of the name ("requires torchvision (not installed)"), named here directly: the same class, and
a bare import of the modules making one (the world encoder, the tiny presets) says nothing.

:data:`BlipImageProcessor` is BLIP's image processor class: its PIL backend ``BlipImageProcessorPil`` (no torchvision
here; transformers' ``BlipImageProcessor`` would fall back to it with a warning), else, on an older transformers
without it, ``BlipImageProcessor``. :class:`finecap.models.blip.Blip` loads and the tiny presets save one.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoConfig, AutoProcessor, ProcessorMixin
from transformers.utils import is_torchvision_available
from transformers.video_processing_utils import BaseVideoProcessor

if is_torchvision_available():
    from transformers import CLIPImageProcessor
else:  # the class transformers' name falls back to without torchvision, named directly: importing the name warned
    from transformers import CLIPImageProcessorPil as CLIPImageProcessor

try:  # BLIP's PIL backend (no torchvision here); ``BlipImageProcessor`` would fall back to it with a warning
    from transformers import BlipImageProcessorPil as BlipImageProcessor
except ImportError:  # pragma: no cover - older transformers
    from transformers import BlipImageProcessor

__all__ = ["BlipImageProcessor", "CLIPImageProcessor", "image_only_processor", "load_processor", "video_settings"]


@functools.cache
def image_only_processor(cls: type) -> type:
    """``cls`` (a processor class such as ``Qwen2VLProcessor``) without its ``video_processor``: what
    :func:`load_processor` builds when ``transformers`` cannot make the video processor (no ``torchvision``).

    Not a re-implementation: the subclass only drops ``video_processor`` from the attributes that
    ``ProcessorMixin`` checks, saves and loads (and renders the chat template with ``ProcessorMixin``'s method, where
    SmolVLM's override reads its video processor's frame defaults); the family's own ``__call__`` (chat template,
    image-token expansion, image processor) runs unchanged, and its folders keep the class name and hold the video
    processor's settings (``processor_config.json``'s ``video_processor``: the instance's ``video_settings``, which
    :func:`load_processor` reads from the source; else the image processor's, as transformers reads a video processor
    from a folder holding only the image processor's file), so ``AutoProcessor`` reads them where ``torchvision`` is
    installed (without them it refused the folder: "Can't load video processor")."""

    @classmethod
    def get_attributes(sub: type) -> list[str]:
        return [a for a in cls.get_attributes() if a != "video_processor"]

    def to_dict(self: Any) -> dict[str, Any]:
        """``ProcessorMixin``'s, with the video processor's settings it cannot serialise itself (docstring above)."""
        out = cls.to_dict(self)
        image = out.get("image_processor")
        settings = self.video_settings if self.video_settings is not None else image
        if isinstance(settings, dict):
            out["video_processor"] = dict(settings)
        return out

    def apply_chat_template(self: Any, *args: Any, **kwargs: Any) -> Any:
        """``ProcessorMixin``'s: SmolVLM's own override only adds its video processor's frame defaults."""
        return ProcessorMixin.apply_chat_template(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"get_attributes": get_attributes, "video_processor": None,
                                       "video_settings": None, "to_dict": to_dict,
                                       "apply_chat_template": apply_chat_template, "__module__": cls.__module__,
                                       "__doc__": cls.__doc__})  # fmt: skip


def video_settings(name: str) -> dict[str, Any] | None:
    """The video processor's settings that ``name`` (a folder or Hub name) holds, as ``AutoVideoProcessor`` reads
    them (``processor_config.json``'s ``video_processor``, else ``video_preprocessor_config.json``, else the image
    processor's ``preprocessor_config.json``); ``None`` when it holds none."""
    try:
        settings, _ = BaseVideoProcessor.get_video_processor_dict(name)
    except OSError:
        return None
    return settings if isinstance(settings, dict) else None


def load_processor(name_or_path: str | Path) -> Any:
    """``AutoProcessor.from_pretrained``; without ``torchvision``, a processor whose class needs a video processor is
    built without one (:func:`image_only_processor`), keeping the folder's video processor settings
    (:func:`video_settings`) to save them again."""
    name = str(name_or_path)
    try:
        return AutoProcessor.from_pretrained(name, trust_remote_code=False)
    except (ImportError, OSError, TypeError, ValueError):
        if is_torchvision_available():
            raise
        model_type = AutoConfig.from_pretrained(name, trust_remote_code=False).model_type
        class_name = transformers.models.auto.processing_auto.PROCESSOR_MAPPING_NAMES.get(model_type)
        cls = getattr(transformers, class_name, None) if class_name else None
        if cls is None or "video_processor" not in cls.get_attributes():
            raise
        # video_processor=None always: SmolVLM's has no default, and the folder's settings (a saved
        # processor_config.json's video_processor) are no processor to pass
        extra = {"video_processor": None} if "video_processor" in inspect.signature(cls.__init__).parameters else {}
        processor = image_only_processor(cls).from_pretrained(name, trust_remote_code=False, **extra)
        processor.video_settings = video_settings(name)
        return processor
