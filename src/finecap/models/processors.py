"""Loading a VLM's processor (``AutoProcessor``), also where ``transformers`` cannot build its video processor.

Without ``torchvision``, ``transformers`` cannot build the video processor that Qwen2-VL's processor class requires
(its class check and ``AutoVideoProcessor`` both need it), although captioning never touches videos:
:func:`load_processor` then builds the family's processor class without its video processor
(:func:`image_only_processor`).
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoConfig, AutoProcessor, ProcessorMixin
from transformers.utils import is_torchvision_available


@functools.cache
def image_only_processor(cls: type) -> type:
    """``cls`` (a processor class such as ``Qwen2VLProcessor``) without its ``video_processor``: what
    :func:`load_processor` builds when ``transformers`` cannot make the video processor (no ``torchvision``).

    Not a re-implementation: the subclass only drops ``video_processor`` from the attributes that
    ``ProcessorMixin`` checks, saves and loads (and renders the chat template with ``ProcessorMixin``'s method, where
    SmolVLM's override reads its video processor's frame defaults); the family's own ``__call__`` (chat template,
    image-token expansion, image processor) runs unchanged, and its folders keep the class name, so ``AutoProcessor``
    reads them where ``torchvision`` is installed."""

    @classmethod
    def get_attributes(sub: type) -> list[str]:
        return [a for a in cls.get_attributes() if a != "video_processor"]

    def apply_chat_template(self: Any, *args: Any, **kwargs: Any) -> Any:
        """``ProcessorMixin``'s: SmolVLM's own override only adds its video processor's frame defaults."""
        return ProcessorMixin.apply_chat_template(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"get_attributes": get_attributes, "video_processor": None,
                                       "apply_chat_template": apply_chat_template, "__module__": cls.__module__,
                                       "__doc__": cls.__doc__})  # fmt: skip


def load_processor(name_or_path: str | Path) -> Any:
    """``AutoProcessor.from_pretrained``; without ``torchvision``, a processor whose class needs a video processor is
    built without one (:func:`image_only_processor`)."""
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
        video = inspect.signature(cls.__init__).parameters.get("video_processor")
        extra = {"video_processor": None} if video is not None and video.default is inspect.Parameter.empty else {}
        return image_only_processor(cls).from_pretrained(name, trust_remote_code=False, **extra)  # SmolVLM: no default
