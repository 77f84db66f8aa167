"""A stand-in for a model whose preprocessing refuses some images (Mistral 3 refuses an image of one image token:
:func:`finecap.models.vlm.check_image_tokens`), on the tiny ClipCap's CLIP encoder: a Mistral 3 captioner is too
slow to caption or train with end to end (tests/app/test_caption_images.py,
tests/train/test_skip_refused_images.py)."""

from __future__ import annotations

REFUSED_SIZE = (8, 8)
"""The size of the images the stand-in refuses."""

WHY = "8 x 8 pixels gives the model one image token, which it fails on"
"""The reason it gives."""


def refuse_tiny_images(monkeypatch, *, declared: bool = False) -> str:
    """The ClipCap encoder's preprocessing made to refuse every 8 x 8 image as Mistral 3's refuses an image of one
    image token (an :class:`~finecap.data.images.ImageRefused` with its place in the batch), and a split captioned
    from pixels as a VLM's own vision tower is (not through the frozen-feature cache); the reason given.
    ``declared``: the encoder also declares its refusals (``refuses_images``, as Mistral 3's does), so that reading a
    split with the model leaves the refused images out up front (:func:`finecap.data.datasets.refused_images`)."""
    from finecap.data.images import ImageRefused
    from finecap.engines.finecap import FinecapEngine
    from finecap.models.vision import VisionEncoder

    real = VisionEncoder.preprocess

    def refusing(self, images):
        for k, image in enumerate(images):
            if image.size == REFUSED_SIZE:
                raise ImageRefused(WHY, k)
        return real(self, images)

    monkeypatch.setattr(VisionEncoder, "preprocess", refusing)
    monkeypatch.setattr(FinecapEngine, "cache_features", property(lambda self: False))
    if declared:
        monkeypatch.setattr(VisionEncoder, "refuses_images", True, raising=False)
    return WHY
