"""METEOR 1.5's statistics and scores, with the jar's floating-point operations in the jar's order.

A segment's 23 statistics (what the jar's ``SCORE`` line prints): test length, reference length, test function
words, reference function words; for each of the 4 stages (exact, stem, synonym, paraphrase) test content matches,
reference content matches, test function matches, reference function matches; then chunks, test matched words,
reference matched words. :func:`segment_score` turns them into a score, :func:`corpus_score` scores a corpus from
the summed statistics (a segment matched perfectly, every word in one chunk, adds no chunk), as the jar's ``EVAL``
does.

Parameters of ``-l en`` (task "rank"): stage weights 1.0 0.6 0.8 0.6, alpha 0.85, beta 0.2, gamma 0.6, delta 0.75.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from decimal import Decimal, localcontext

__all__ = ["ALPHA", "BETA", "DELTA", "GAMMA", "N_STATS", "WEIGHTS", "corpus_score", "score_bound", "segment_score"]

WEIGHTS = (1.0, 0.6, 0.8, 0.6)
ALPHA, BETA, GAMMA, DELTA = 0.85, 0.2, 0.6, 0.75
N_STATS = 23


def _div(a: float, b: float) -> float:
    """Java's double division (no exception: x/0 is +-inf, 0/0 NaN)."""
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def segment_score(st: Sequence[float]) -> float:
    """The METEOR score of one segment's 23 statistics (0 when undefined, never negative).

    >>> segment_score([3, 3, 1, 1, 2, 2, 1, 1] + [0] * 12 + [1, 3, 3])  # identical 3-word sentences: no penalty
    1.0
    """
    tl, rl, tf, rf = st[0], st[1], st[2], st[3]
    pw = rw = 0.0
    for s in range(4):
        pw += DELTA * (WEIGHTS[s] * st[4 + 4 * s])
        rw += DELTA * (WEIGHTS[s] * st[5 + 4 * s])
    for s in range(4):
        pw += (1.0 - DELTA) * (WEIGHTS[s] * st[6 + 4 * s])
        rw += (1.0 - DELTA) * (WEIGHTS[s] * st[7 + 4 * s])
    p = _div(pw, DELTA * (tl - tf) + (1.0 - DELTA) * tf)
    r = _div(rw, DELTA * (rl - rf) + (1.0 - DELTA) * rf)
    fmean = _div(1.0, _div(1.0 - ALPHA, p) + _div(ALPHA, r))
    chunks, tm, rm = st[20], st[21], st[22]
    frag = 0.0 if tm == tl and rm == rl and chunks == 1 else _div(chunks, (tm + rm) / 2.0)
    if math.isnan(frag) or math.isnan(fmean):
        return 0.0
    score = fmean * (1.0 - GAMMA * java_pow(frag))
    return 0.0 if math.isnan(score) else max(score, 0.0)


def score_bound(p_weight: float, r_weight: float, hyp, ref, longest_chunk: int, perfect_possible: bool) -> float:
    """An upper bound of :func:`segment_score` for the alignments of ``hyp`` against ``ref`` (segments with
    ``info`` and ``n_function``) whose weighted matches on each side are at most ``p_weight`` and ``r_weight`` (the
    sums of ``delta`` or ``1 - delta`` times the stage weight that :func:`segment_score` forms) and whose chunks
    hold at most ``longest_chunk`` words (both sides); ``perfect_possible``: whether one chunk can hold every word of
    both.

    Precision and recall grow with the weights, and so does their harmonic mean; an alignment that is not perfect
    with ``m`` matched words has at least ``m / longest_chunk`` chunks, so its fragmentation (chunks over ``m / 2``)
    is at least ``2 / longest_chunk`` and its penalty at least ``gamma * (2 / longest_chunk) ** beta``. The bound is
    raised by a relative 1e-9, far above the rounding of either computation, so that a segment whose bound is below
    another's score scores lower for certain.

    >>> from types import SimpleNamespace as S
    >>> words = S(info=[0, 0, 0], n_function=1)
    >>> st = [3, 3, 1, 1, 1, 1, 0, 0] + [0] * 12 + [1, 1, 1]  # one content word matched on each side, exactly
    >>> segment_score(st) <= score_bound(DELTA, DELTA, words, words, 2, False) < 1.001 * segment_score(st)
    True
    """
    if p_weight <= 0.0 or r_weight <= 0.0:
        return 0.0
    tl, rl, tf, rf = len(hyp.info), len(ref.info), hyp.n_function, ref.n_function
    p = p_weight / (DELTA * (tl - tf) + (1.0 - DELTA) * tf)
    r = r_weight / (DELTA * (rl - rf) + (1.0 - DELTA) * rf)
    fmean = 1.0 / ((1.0 - ALPHA) / p + ALPHA / r)
    if not perfect_possible:
        fmean *= 1.0 - GAMMA * (2.0 / longest_chunk) ** BETA
    return fmean * (1.0 + 1e-9)


def java_pow(x: float) -> float:
    """``Math.pow(x, 0.2)`` as the JVM (HotSpot, x86-64) computes it, for the fragmentation penalty.

    HotSpot's ``Math.pow`` is not the C library's: among the 152,096 fragmentation values a segment of up to 1,000
    matched words can have (``chunks / (matched / 2)``), Python's ``math.pow`` differs from it in the last bit on a
    few hundred, while the correctly rounded power differs on 99. Those 99 (measured with a two-line Java program
    calling ``Math.pow``; :data:`_JAVA_POW`) are looked up; every other value is the correctly rounded power, which
    is also the best predictor of the JVM for the arbitrary fragmentation of a corpus score (it disagrees with the
    JVM on about 0.05 % of doubles, by one unit in the last place).

    >>> java_pow(0.5) == 0.8705505632961241, java_pow(0.0)
    (True, 0.0)
    """
    out = _POW_CACHE.get(x)
    if out is None:
        if not _JAVA_POW:
            _JAVA_POW.update({ch / (n / 2.0): float.fromhex(v) for ch, n, v in _JAVA_POW_ROWS})
        out = _JAVA_POW.get(x)
        if out is None:
            with localcontext() as ctx:
                ctx.prec = 50
                out = float(Decimal(x) ** _BETA)
        _POW_CACHE[x] = out
    return out


_BETA = Decimal(BETA)  # the double 0.2, exactly
_POW_CACHE: dict[float, float] = {}
_JAVA_POW: dict[float, float] = {}
_JAVA_POW_ROWS = (  # (chunks, test + reference matched words, Math.pow(chunks / (matched / 2), 0.2).hex())
    (55, 117, "0x1.f9b8ad38cfa7ap-1"), (22, 131, "0x1.9ba1171c64952p-1"), (44, 167, "0x1.c26cfd53f073ap-1"),
    (37, 193, "0x1.a6ac5f3556bd3p-1"), (50, 203, "0x1.bc65894f2a89cp-1"), (60, 269, "0x1.b3ab081be87c8p-1"),
    (113, 290, "0x1.e717daaba6002p-1"), (91, 295, "0x1.d0db84a3539f4p-1"), (137, 311, "0x1.f33143758201dp-1"),
    (95, 343, "0x1.c6f2b6c96a1e0p-1"), (73, 345, "0x1.af1944658a8d4p-1"), (148, 349, "0x1.ef6881d1166f5p-1"),
    (131, 350, "0x1.e33043102ac66p-1"), (173, 369, "0x1.f973b55ecf302p-1"), (71, 402, "0x1.9fcc4b2f14c24p-1"),
    (14, 405, "0x1.2c0fcb71636fap-1"), (134, 439, "0x1.cfe0d562e9a39p-1"), (219, 451, "0x1.fd038217f4140p-1"),
    (151, 502, "0x1.ce8524f186a72p-1"), (157, 507, "0x1.d137339e45730p-1"), (43, 513, "0x1.66378c8af680cp-1"),
    (175, 519, "0x1.d934b21bf3c7ep-1"), (189, 520, "0x1.e05c641d479dap-1"), (115, 523, "0x1.b26ce5c06a05cp-1"),
    (57, 538, "0x1.7766722c4913ap-1"), (216, 539, "0x1.e9d58347f35d7p-1"), (268, 541, "0x1.ff0cd273501afp-1"),
    (17, 542, "0x1.26489252a7d34p-1"), (23, 546, "0x1.382a0476f8566p-1"), (27, 550, "0x1.41dde640dfa6ep-1"),
    (227, 562, "0x1.ea9b6dd3d28a4p-1"), (119, 570, "0x1.adf147ed7ff70p-1"), (234, 577, "0x1.eb00b784495b6p-1"),
    (250, 579, "0x1.f1325bcda1e98p-1"), (9, 580, "0x1.ff4ab5d1cd78cp-2"), (59, 581, "0x1.743ad40101bc2p-1"),
    (43, 589, "0x1.5c74752ec7368p-1"), (101, 591, "0x1.9d11b26cd2bdep-1"), (89, 599, "0x1.91ab54abc2bc4p-1"),
    (149, 599, "0x1.bd46474a137b0p-1"), (185, 599, "0x1.d0f852810a37ep-1"), (253, 600, "0x1.eed880cd5bb38p-1"),
    (203, 614, "0x1.d7590a1158884p-1"), (179, 617, "0x1.cb2fdbb655a92p-1"), (80, 629, "0x1.855f0720ebbb4p-1"),
    (204, 631, "0x1.d53dbe3882cccp-1"), (296, 633, "0x1.f9304980bba44p-1"), (36, 649, "0x1.49d3f7c98a57cp-1"),
    (21, 652, "0x1.27d960bc7e8a8p-1"), (254, 663, "0x1.e571e8fd73444p-1"), (207, 698, "0x1.cd35d288fe1aap-1"),
    (341, 708, "0x1.fc2edd0c99199p-1"), (79, 719, "0x1.7a24811c2c6dcp-1"), (311, 724, "0x1.f0af263746420p-1"),
    (164, 727, "0x1.b4a78735055c0p-1"), (252, 727, "0x1.dbd3bdc4684f6p-1"), (27, 731, "0x1.30106d006bef8p-1"),
    (129, 737, "0x1.9f0ccbf2bdb7ep-1"), (84, 739, "0x1.7cb7b33b1f154p-1"), (369, 743, "0x1.ff4f1d335f18ap-1"),
    (209, 774, "0x1.c4a4eec0d8d00p-1"), (274, 777, "0x1.dd7721d1c8cc6p-1"), (373, 781, "0x1.fb5393541b6b9p-1"),
    (234, 785, "0x1.cdaf34d5d848ap-1"), (31, 786, "0x1.34148815eaab1p-1"), (177, 794, "0x1.b39e630234f92p-1"),
    (283, 800, "0x1.ddc41945f1f16p-1"), (327, 802, "0x1.eb87db2058587p-1"), (98, 809, "0x1.819856689fb16p-1"),
    (191, 812, "0x1.b852b3e2c1362p-1"), (43, 816, "0x1.467613825c4f0p-1"), (176, 821, "0x1.b039983f8a7bdp-1"),
    (385, 821, "0x1.f97989dc3cdecp-1"), (367, 827, "0x1.f3edbf65e3228p-1"), (419, 855, "0x1.fdf2951c9bc24p-1"),
    (167, 857, "0x1.a80e4e2d55d76p-1"), (177, 857, "0x1.ad0456b40d40ap-1"), (187, 859, "0x1.b18e7350a5077p-1"),
    (233, 862, "0x1.c4bc97b3a1f32p-1"), (417, 862, "0x1.fca1342b501b8p-1"), (202, 879, "0x1.b646dad697fe2p-1"),
    (316, 881, "0x1.df1758f8136ecp-1"), (211, 882, "0x1.b9d031030ec46p-1"), (358, 889, "0x1.ea4fc85bbf2e0p-1"),
    (95, 906, "0x1.769f9f1627ae5p-1"), (362, 939, "0x1.e60dd5748a748p-1"), (157, 944, "0x1.9ad452198cc12p-1"),
    (371, 953, "0x1.e700eb37b0b57p-1"), (291, 955, "0x1.cfb7c9e9fa11ap-1"), (129, 956, "0x1.8a016acb0d232p-1"),
    (2, 957, "0x1.56658dfa4eb8cp-2"), (439, 959, "0x1.f70b048782c20p-1"), (361, 963, "0x1.e356deddafd52p-1"),
    (148, 969, "0x1.93e3f24cc6aacp-1"), (145, 974, "0x1.91d364aacdef2p-1"), (439, 975, "0x1.f5618e6c354f9p-1"),
    (444, 979, "0x1.f61b50a1fe418p-1"), (395, 986, "0x1.e9cd26a309c02p-1"), (152, 991, "0x1.943b36fec9c74p-1")
)  # fmt: skip


def is_perfect(st: Sequence[float]) -> bool:
    """Every word of both sentences matched, in one chunk."""
    return st[21] == st[0] and st[22] == st[1] and st[20] == 1


def corpus_score(stats: Iterable[Sequence[float]]) -> float:
    """The jar's aggregate score: :func:`segment_score` of the summed statistics, where perfect segments add no
    chunk (it is not the mean of the segment scores).

    >>> a = [3, 3, 1, 1, 2, 2, 1, 1] + [0] * 12 + [1, 3, 3]
    >>> b = [2, 2, 0, 0, 1, 1, 0, 0] + [0] * 12 + [1, 1, 1]
    >>> corpus_score([a, b]) == segment_score([5, 5, 1, 1, 3, 3, 1, 1] + [0] * 12 + [1, 4, 4])
    True
    """
    total = [0.0] * N_STATS
    for st in stats:
        perfect = is_perfect(st)
        for k in range(N_STATS):
            if k != 20 or not perfect:
                total[k] += st[k]
    return segment_score(total)
