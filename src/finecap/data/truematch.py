"""TrueMatch bags of highly similar images (NDLB Sec. 3.1, Algorithms 1 and 2); ``finecap bags build``
(:mod:`finecap.app.bags`) builds them for a data split.

Algorithm 1 (candidate bags), per image ``r`` of a split:

1. Multimodal embedding ``m_r = concat(z_r, t_r)``: ``z_r`` the CLIP image embedding, ``t_r`` the mean CLIP text
   embedding of the image's reference captions (:func:`multimodal_embeddings`).
2. Cosine nearest neighbours of ``m_r`` among the other images (:func:`nearest_neighbours`, exact).
3. Candidate bag ``b_r = [r] + its s-1 nearest images`` with intra-bag similarity
   ``alpha_r = mean_k cos(m_r, m_k)`` over the ``s-1`` neighbours ``k`` (Algorithm 1, line 14).

Algorithm 2 (curation): sort the candidate bags by ``alpha`` (descending) and keep a bag only if none of its images is
already in a kept bag (:func:`curate_bags`). Bag sizes are independent: each size gets its own curated list, and an
image may be in one bag of size 3 and one of size 5.

Choices the paper leaves open (or states two ways):

- **Normalisation.** ``z`` is L2-normalised; ``t`` is the mean of the L2-normalised caption embeddings, L2-normalised
  again; both halves therefore have unit norm and the cosine of two concatenations is the *average of the image
  cosine and the text cosine* (``|m| = sqrt(2)``), so neither modality dominates whatever CLIP's feature scales.
  The concatenation is L2-normalised before the search, so dot products are cosines.
- **Intra-bag similarity.** Algorithm 1 (line 14) averages the query's cosine to its ``s-1`` bag-mates, while Sec. 3.1
  speaks of "an average pairwise cosine similarity between ... all images in the bag". ``similarity="query"`` (the
  default) follows the algorithm; ``similarity="pairwise"`` averages over all ``s(s-1)/2`` pairs of the bag
  (``eval.bag_similarity``). For ``s = 2`` both agree.
- **The images.** NDLB pools COCO's Karpathy validation and test images (10,000, App. B.1); ``finecap bags build``
  takes one split (``--split``, default ``test``), so the bags' images are those ``finecap eval`` scores with that
  split's captions. To pool two splits, list their images under one split name in the data file.
- **Ties.** Neighbours with equal similarity are taken in increasing index order; bags with equal ``alpha`` are kept
  in increasing query order (stable sort). Results are therefore deterministic.
- **Duplicates.** Only the image itself is excluded from its neighbours, as in Algorithm 1. Two images with the same
  multimodal embedding (one photo twice under two ids) are each other's nearest neighbours and make the hardest bag
  (``alpha = 1``), one no caption can win (the retriever scores both alike and a tie counts against the caption,
  :mod:`finecap.metrics.retrieval`); ``bags.keep_hardest`` keeps such bags first. The paper's manual filter would drop
  them: reject them in ``finecap bags review``.
- **The filter.** The paper's manual filtering step kept the bags "that would require captioning systems to capture
  some aspect of fine-grained visual discrimination" (680 -> 254 bags of size 3 on COCO, about 37 %). Its automated
  stand-in here is :func:`keep_hardest`: the highest-``alpha`` share ``bags.keep_hardest`` of the curated bags of
  each size (1 = all, the default, which the demo and the papers' grids keep: on their family world the hardest
  third sat near chance for every captioner).
  What makes bags hard is the pool: on the world's 1,000 test images, which hold no near-duplicates, the curated
  bags covered most of the split and were easier than 99 random distractors; the demo builds them on the
  scene-family test world instead. The JSON lists the kept bags with their similarity and,
  per size, how many were curated and their mean ``alpha`` before and after the filter (:func:`bag_statistics`), so
  a threshold or a manual pass (``finecap bags review``) can follow.

Scaling of the exact search (:func:`nearest_neighbours`): rows are processed in blocks whose ``(block, N)`` similarity
matrix stays under ``max_block_bytes`` (64 MB by default), so memory is ``O(N * d + block * N)`` and time
``O(N^2 * d)``, dominated by the matrix product. Measured (CPU, float32, torch with 2 threads): 20,000 random
1024-d embeddings (512-d image + 512-d text, the ViT-B/32 size) take 11 CPU-seconds with k = 6 (bags up to 7) and
14 CPU-seconds with k = 200 (training bags), i.e. about 6-7 s of wall time on two free cores (22-25 s were
measured on two cores shared with other jobs). Time grows with N^2: about 70 CPU-seconds for 50,000 images and
5-6 CPU-minutes for COCO's 113,000 training images; ``device="cuda"`` (used automatically when the retriever is
on a GPU) makes these seconds. Beyond a few hundred thousand images, use an approximate index (e.g. FAISS).

On the world with scene families, :func:`family_purity` reports how often a bag lies within one family (the
intended hard cases: scenes that differ in one detail), next to the purity of random bags of the same sizes. A bag
larger than the families (``world.families``) can never be pure; the command says so next to its number.

JSON written by ``finecap bags build`` (read back by :func:`finecap.data.bags_file.read_bags`)::

    {"split": "test", "data": "...", "fingerprint": {...}, "n_images": 1000, "similarity": "query",
     "retriever": "...", "retriever_fingerprint": {...}, "sizes": [3, 5, 7], "keep_hardest": 0.333,
     "long_text": "truncate", "jpeg_draft": true, "batch_size_eval": 256, "curated": {"3": 333, ...},
     "alpha_curated": {"3": 0.81, ...},   # the kept bags' mean alpha: bag_statistics, from their "similarity"
     "bags": {"3": [{"images": [id, id, id], "similarity": 0.97}, ...], "5": [...], "7": [...]},
     "family_purity": {"3": 0.81, ...}, "family_purity_random": {"3": 0.01, ...}}   # purity: world with families only

Example::

    >>> import numpy as np
    >>> emb = np.array([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0], [0.1, 0.99]])
    >>> bags = build_bags(emb, [2])[2]
    >>> [b.images for b in bags]
    [[2, 3], [0, 1]]
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from finecap.data.records import Record

Similarity = Literal["query", "pairwise"]
SIMILARITIES: tuple[str, ...] = ("query", "pairwise")
MAX_BLOCK_BYTES = 64 * 2**20


@dataclass
class Bag:
    """A bag of images (``images[0]`` is the query it was built from) and its intra-bag similarity."""

    images: list[Any]
    similarity: float

    def to_dict(self) -> dict[str, Any]:
        return {"images": list(self.images), "similarity": self.similarity}


# --------------------------------------------------------------------------------------------------------------------
# Embeddings and exact neighbour search
# --------------------------------------------------------------------------------------------------------------------


def _tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu()
    return torch.as_tensor(np.asarray(x, dtype=np.float32))


def multimodal_embeddings(image_emb: Any, text_emb: Any) -> torch.Tensor:
    """``(N, D_img + D_txt)`` unit-norm concatenation of unit-norm image and (mean) text embeddings.

    Args:
        image_emb: ``(N, D_img)`` image embeddings (normalised here).
        text_emb: ``(N, D_txt)`` per image, the mean of its caption embeddings (normalised here; pass the mean of
            unit-norm caption embeddings, see :func:`mean_text_embeddings`).

    The cosine of two results is ``(cos(z_a, z_b) + cos(t_a, t_b)) / 2`` (module docstring).
    """
    z, t = _tensor(image_emb), _tensor(text_emb)
    if z.ndim != 2 or t.ndim != 2 or len(z) != len(t):
        raise ValueError(f"image embeddings {tuple(z.shape)} and text embeddings {tuple(t.shape)} must be (N, D)")
    m = torch.cat([F.normalize(z, dim=-1), F.normalize(t, dim=-1)], dim=-1)  # (N, D_img + D_txt), norm sqrt(2)
    return F.normalize(m, dim=-1)  # (N, D_img + D_txt), unit norm


def mean_text_embeddings(caption_emb: Any, counts: Sequence[int]) -> torch.Tensor:
    """``(N, D)`` mean of each image's unit-norm caption embeddings; ``caption_emb`` ``(sum(counts), D)`` is grouped
    image by image (``counts[i]`` captions of image ``i``, each >= 1)."""
    c = F.normalize(_tensor(caption_emb), dim=-1)  # (C, D)
    if sum(counts) != len(c):
        raise ValueError(f"{len(c)} caption embeddings but counts sum to {sum(counts)}")
    if any(n < 1 for n in counts):
        raise ValueError("every image needs at least one reference caption")
    index = torch.repeat_interleave(torch.arange(len(counts)), torch.as_tensor(list(counts)))  # (C,)
    sums = torch.zeros(len(counts), c.shape[1]).index_add_(0, index, c)  # (N, D)
    return sums / torch.as_tensor(list(counts), dtype=torch.float32)[:, None]  # (N, D)


def _exact_topk(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k columns per row with ties at the cut resolved towards lower column indices (unsorted)."""
    kth = torch.topk(sims, k, dim=1).values[:, -1:]  # (b, 1): the k-th largest value
    above = sims > kth  # (b, N)
    tie = sims == kth  # (b, N)
    need = k - above.sum(dim=1, keepdim=True)  # (b, 1): how many of the ties at the cut to take
    tie &= torch.cumsum(tie.to(torch.int32), dim=1) <= need  # the lowest-index ties
    cols = (above | tie).nonzero()[:, 1].view(len(sims), k)  # (b, k), row-major: columns ascending
    return sims.gather(1, cols), cols


def _block_topk(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k per row, best first, equal values ordered by column index: values and indices ``(b, k)``.

    ``torch.topk`` alone picks arbitrarily among values tied at the cut; rows where the k-th and (k+1)-th values tie
    are redone with :func:`_exact_topk` (rare with real embeddings), so results never depend on the kernel.
    """
    if k >= sims.shape[1]:
        vals, cols = _exact_topk(sims, sims.shape[1])
    else:
        vals, cols = torch.topk(sims, k + 1, dim=1)  # (b, k+1), descending
        ambiguous = (vals[:, k - 1] == vals[:, k]).nonzero().flatten()  # rows with a tie across the cut
        vals, cols = vals[:, :k], cols[:, :k]
        if len(ambiguous):
            vals[ambiguous], cols[ambiguous] = _exact_topk(sims[ambiguous], k)
    by_index = torch.argsort(cols, dim=1)  # (b, k): ascending column index first ...
    vals, cols = vals.gather(1, by_index), cols.gather(1, by_index)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices  # ... then by value, ties keep index order
    return vals.gather(1, order), cols.gather(1, order)


def check_finite(emb: torch.Tensor, ids: Sequence[Hashable] | None = None) -> None:
    """A ``ValueError`` naming the images (``ids[row]``, else the row) whose embedding in ``emb`` ``(N, d)`` holds a
    NaN or an infinity (a half-precision overflow): ``torch.topk`` ranks NaN above every cosine, so such an image
    would be every image's nearest neighbour."""
    bad = (~torch.isfinite(emb).all(dim=-1)).nonzero().flatten().tolist() if emb.numel() else []  # rows
    if bad:
        names = [ids[r] for r in bad[:5]] if ids is not None else bad[:5]
        which = "image(s)" if ids is not None else "row(s)"
        raise ValueError(f"embeddings: {len(bad)} of {len(emb)} are not finite (NaN or infinite), of {which} "
                         f"{names}{' ...' if len(bad) > 5 else ''}; is the retriever's output finite?")  # fmt: skip


def nearest_neighbours(
    emb: Any,
    k: int,
    *,
    exclude_self: bool = True,
    max_block_bytes: int = MAX_BLOCK_BYTES,
    device: str | torch.device | None = None,
    ids: Sequence[Hashable] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact cosine nearest neighbours: ``(similarities, indices)``, each ``(N, k)`` on the CPU, best first.

    ``emb`` ``(N, d)`` is L2-normalised here. Rows are searched in blocks (``block * N * 4`` bytes at most
    ``max_block_bytes``), so memory stays bounded; ``device`` runs the search elsewhere (e.g. ``"cuda"``). See the
    module docstring for timings. With ``exclude_self`` an image is never its own neighbour (even when another image
    has an identical embedding, which then comes first). An embedding that is not finite is refused before the
    search, naming its image (``ids``, the rows' image ids, else its row): :func:`check_finite`.
    """
    e = _tensor(emb)  # (N, d)
    check_finite(e, ids)
    e = F.normalize(e, dim=-1)  # (N, d)
    if device is not None:
        e = e.to(device)
    n = len(e)
    limit = n - 1 if exclude_self else n
    if not 1 <= k <= limit:
        raise ValueError(f"need 1 <= k <= {limit} neighbours for {n} images, got k={k}")
    block = max(1, min(n, max_block_bytes // (4 * n)))
    sims_out = torch.empty(n, k)
    idx_out = torch.empty(n, k, dtype=torch.long)
    for start in range(0, n, block):
        stop = min(n, start + block)
        sims = e[start:stop] @ e.T  # (b, N) cosine similarities
        if exclude_self:
            rows = torch.arange(stop - start, device=sims.device)
            sims[rows, rows + start] = -math.inf
        vals, cols = _block_topk(sims, k)  # (b, k)
        sims_out[start:stop], idx_out[start:stop] = vals.cpu(), cols.cpu()
    return sims_out, idx_out


# --------------------------------------------------------------------------------------------------------------------
# Algorithms 1 and 2
# --------------------------------------------------------------------------------------------------------------------


def candidate_bags(
    emb: Any,
    size: int,
    *,
    similarity: Similarity = "query",
    neighbours: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1: one candidate bag per image, ``(bags (N, size) long, alpha (N,))``; ``bags[r, 0] == r``.

    ``neighbours``: precomputed :func:`nearest_neighbours` with at least ``size - 1`` columns (reused across sizes).
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"bag similarity {similarity!r} unknown; valid: {', '.join(SIMILARITIES)}")
    if size < 2:
        raise ValueError(f"bag size must be >= 2, got {size}")
    e = F.normalize(_tensor(emb), dim=-1)  # (N, d)
    n = len(e)
    if size > n:
        raise ValueError(f"bag size {size} exceeds the {n} images")
    sims, idx = neighbours if neighbours is not None else nearest_neighbours(e, size - 1)
    if idx.shape[1] < size - 1:
        raise ValueError(f"neighbour table has {idx.shape[1]} columns, bag size {size} needs {size - 1}")
    sims, idx = sims[:, : size - 1], idx[:, : size - 1]  # (N, s-1)
    bags = torch.cat([torch.arange(n)[:, None], idx], dim=1)  # (N, s)
    if similarity == "query":
        alpha = sims.mean(dim=1)  # (N,): mean cosine of the query to its s-1 bag-mates
    else:
        # members in index order: the same images from two queries give bit-identical alpha, so ties keep query order
        members = e[bags.sort(dim=1).values]  # (N, s, d)
        gram = members @ members.transpose(1, 2)  # (N, s, s)
        iu = torch.triu_indices(size, size, offset=1)
        alpha = gram[:, iu[0], iu[1]].mean(dim=1)  # (N,): mean over the s(s-1)/2 pairs
    return bags, alpha


def curate_bags(bags: Any, alpha: Any) -> list[int]:
    """Algorithm 2: indices of the bags kept, in descending ``alpha`` (ties: lower index first).

    A bag is kept only if none of its images is in a bag kept before.
    """
    bags_list = [list(map(int, b)) for b in (bags.tolist() if hasattr(bags, "tolist") else bags)]
    alpha_arr = np.asarray(alpha.tolist() if hasattr(alpha, "tolist") else alpha, dtype=np.float64)
    if len(bags_list) != len(alpha_arr):
        raise ValueError(f"{len(bags_list)} bags but {len(alpha_arr)} similarities")
    order = np.argsort(-alpha_arr, kind="stable")
    used: set[int] = set()
    kept = []
    for b in order.tolist():
        members = bags_list[b]
        if used.isdisjoint(members):
            used.update(members)
            kept.append(b)
    return kept


def build_bags(
    emb: Any,
    sizes: Sequence[int],
    ids: Sequence[Hashable] | None = None,
    *,
    similarity: Similarity = "query",
    max_block_bytes: int = MAX_BLOCK_BYTES,
    device: str | torch.device | None = None,
) -> dict[int, list[Bag]]:
    """TrueMatch bags of each size from multimodal embeddings ``(N, d)``: ``{size: [Bag, ...]}``, hardest first.

    ``ids`` names the images (default: row indices; unique). One neighbour search serves every size. An embedding
    that is not finite is refused before it, naming its image (:func:`check_finite`).
    """
    sizes = sorted({int(s) for s in sizes})
    if not sizes:
        raise ValueError("no bag sizes given")
    e = F.normalize(_tensor(emb), dim=-1)
    ids = list(range(len(e))) if ids is None else list(ids)
    if len(ids) != len(e):
        raise ValueError(f"{len(ids)} ids for {len(e)} embeddings")
    if len(set(ids)) != len(ids):  # a bag would name one image twice (read_bags refuses such a file)
        twice = next(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"image ids must be unique: {twice!r} names two embeddings")
    if sizes[0] < 2 or sizes[-1] > len(e):
        raise ValueError(f"bag sizes must lie in [2, {len(e)}] (number of images), got {sizes}")
    neighbours = nearest_neighbours(e, sizes[-1] - 1, max_block_bytes=max_block_bytes, device=device, ids=ids)
    out: dict[int, list[Bag]] = {}
    for s in sizes:
        bags, alpha = candidate_bags(e, s, similarity=similarity, neighbours=neighbours)
        out[s] = [Bag([ids[j] for j in bags[b].tolist()], float(alpha[b])) for b in curate_bags(bags, alpha)]
    return out


def keep_hardest(bags: Sequence[Bag], share: float) -> list[Bag]:
    """The hardest ``ceil(share * len(bags))`` of curated ``bags`` (the highest intra-bag similarity; ties keep their
    order): the automated stand-in for NDLB's manual filter (module docstring).

    Example::

        >>> bags = [Bag([0, 1], 0.2), Bag([2, 3], 0.9), Bag([4, 5], 0.5)]
        >>> [b.images for b in keep_hardest(bags, 1 / 3)], len(keep_hardest(bags, 0.5)), len(keep_hardest(bags, 1))
        ([[2, 3]], 2, 3)
    """
    if not 0 < share <= 1:
        raise ValueError(f"share of bags kept must lie in (0, 1], got {share}")
    order = sorted(range(len(bags)), key=lambda b: -bags[b].similarity)  # stable: equal alpha keep their order
    return [bags[b] for b in order[: math.ceil(round(share * len(bags), 9))]]  # 0.07 x 100 is 7, not 7.000000000000001


def bag_statistics(result: Mapping[str, Any]) -> dict[str, float]:
    """Per bag size ``s`` of a ``finecap bags build`` JSON: ``bag{s}/alpha`` (mean intra-bag similarity of the bags
    kept), ``bag{s}/bags`` (how many), and, when the file records them, ``bag{s}/alpha_curated`` and
    ``bag{s}/curated`` (all curated bags, before :func:`keep_hardest`).

    Example::

        >>> bag_statistics({"bags": {"3": [{"images": [1, 2, 3], "similarity": 0.75}, {"images": [4, 5, 6],
        ...                 "similarity": 0.25}]}, "curated": {"3": 6}, "alpha_curated": {"3": 0.2}})
        {'bag3/alpha': 0.5, 'bag3/bags': 2.0, 'bag3/alpha_curated': 0.2, 'bag3/curated': 6.0}
    """
    out: dict[str, float] = {}
    for size, bags in sorted(result["bags"].items(), key=lambda kv: int(kv[0])):
        if bags:
            out[f"bag{size}/alpha"] = float(np.mean([b["similarity"] for b in bags]))
        out[f"bag{size}/bags"] = float(len(bags))
        if str(size) in result.get("alpha_curated", {}):
            out[f"bag{size}/alpha_curated"] = float(result["alpha_curated"][str(size)])
        if str(size) in result.get("curated", {}):
            out[f"bag{size}/curated"] = float(result["curated"][str(size)])
    return out


# --------------------------------------------------------------------------------------------------------------------
# Scene families
# --------------------------------------------------------------------------------------------------------------------


def family_purity(bags: Sequence[Sequence[Hashable] | Bag], families: Mapping[Hashable, Hashable | None]) -> float:
    """Share of bags whose images all belong to one scene family (an image without a family breaks purity).

    Example::

        >>> family_purity([[1, 2], [3, 4]], {1: 0, 2: 0, 3: 1, 4: 2})
        0.5
    """
    if not bags:
        raise ValueError("family_purity: no bags")
    pure = 0
    for bag in bags:
        images = bag.images if isinstance(bag, Bag) else list(bag)
        fams = {families.get(i) for i in images}
        pure += len(fams) == 1 and None not in fams
    return pure / len(bags)


def random_bag_purity(
    ids: Sequence[Hashable], families: Mapping[Hashable, Hashable | None], size: int, seed: int = 0
) -> float:
    """Purity of random disjoint bags of ``size`` (a seeded shuffle cut into bags): the chance level."""
    order = list(ids)
    random.Random(seed).shuffle(order)
    bags = [order[i : i + size] for i in range(0, len(order) - size + 1, size)]
    return family_purity(bags, families)


# --------------------------------------------------------------------------------------------------------------------
# I/O and the command
# --------------------------------------------------------------------------------------------------------------------


def record_embeddings(retriever: Any, records: Sequence[Record], cache_dir: str | Path | None = None) -> torch.Tensor:
    """Multimodal embeddings ``(N, D_img + D_txt)`` of ``records`` with a :class:`~finecap.models.retriever.Retriever`:
    image embeddings (cached per model and data set) and the mean embedding of each image's reference captions."""
    image_emb = retriever.image_embeddings(records, cache_dir)  # (N, D)
    captions = [c for r in records for c in r.captions]
    text_emb = mean_text_embeddings(retriever.embed_texts(captions), [len(r.captions) for r in records])  # (N, D)
    return multimodal_embeddings(image_emb, text_emb)
