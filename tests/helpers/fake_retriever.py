"""A retriever whose scores are worked out by hand: image ``i`` (its id an int or its string) embeds to the basis
vector ``e_i`` of 4-D space, captions to the vectors of :data:`TEXT`, so their cosines to the images are:

- ``"zero"``  -> (1, 0, 0, 0):     image 0 scores 1 -> rank 1
- ``"one"``   -> (0.8, 0.6, 0, 0): image 1 scores 0.6 but image 0 scores 0.8 -> rank 2
- ``"two"``   -> (0, 0, 1, 0):     rank 1
- ``"three"`` -> (0, 0, 0.6, 0.8): image 3 scores 0.8 > 0.6 -> rank 1

:data:`PREDS` captions image ``i`` with the ``i``-th of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

TEXT = {"zero": [1, 0, 0, 0], "one": [0.8, 0.6, 0, 0], "two": [0, 0, 1, 0], "three": [0, 0, 0.6, 0.8]}
PREDS = {0: "zero", 1: "one", 2: "two", 3: "three"}


@dataclass
class Rec:
    """An image record as the metrics read it (its id and a path never opened)."""

    image_id: int | str
    path: Path = Path("unused.png")


class FakeTokenizer:
    unk_token_id = None  # CLIPScore then uses Hessel's prefix "A photo depicts"


class FakeRetriever:
    """The retriever of the module docstring."""

    tokenizer = FakeTokenizer()
    name = "fake"

    def image_embeddings(self, records, cache_dir=None):
        return torch.eye(4)[[int(r.image_id) for r in records]]  # (N, 4)

    def text_embeddings(self, texts, cache_dir=None):
        return self.embed_texts(texts)

    def embed_texts(self, texts):
        texts = [t.removeprefix("A photo depicts ") for t in texts]
        return F.normalize(torch.tensor([TEXT[t] for t in texts], dtype=torch.float32), dim=-1)  # (B, 4)
