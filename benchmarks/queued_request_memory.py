"""Memory a request waiting in the reward server's queue holds, against the bytes of its body, which
``--max-queued-bytes`` counts (:mod:`finecap.serve.service`, "Queue bound").

    .venv/bin/python benchmarks/queued_request_memory.py

Each request's JSON body is decoded and checked as the server does (``finecap.serve.protocol``: ``decode_json``,
``parse_reward``); measured with ``tracemalloc``: the bytes still allocated while the parsed request is held (its
captions, its image ids or paths), against the body's bytes. Captions of random words from a 13-word vocabulary
(seeded), image ids random among 10,000 or paths of such images.

Result (CPython 3.11.7, Linux x86-64; the sizes of Python's objects, not of the machine; tracemalloc's count varies by
a few hundred bytes between runs): the parsed request holds 2.2 x its body for 1024 captions of 12 words with integer
ids, 1.3 x for 8192 captions of 60 words (a body of 2.6 MB), 2.1 x for 8192 captions of 12 words with image paths,
6.7 x for 8192 one-word captions (the worst here: a string object costs about 50 bytes more than its characters), and
2.4 x for 8192 empty captions of one image (Python shares those objects).
"""

from __future__ import annotations

import json
import random
import tracemalloc

from finecap.serve.protocol import Limits, decode_json, parse_reward

WORDS = ["a", "red", "circle", "small", "blue", "square", "on", "the", "left", "of", "two", "green", "triangles"]


def body(n: int, words: int, rng: random.Random, paths: bool = False) -> bytes:
    """A ``/reward`` body of ``n`` captions of ``words`` random words, by image id or by image path."""
    captions = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]
    images = [rng.randrange(10_000) for _ in range(n)]
    if paths:
        named = [f"/data/world/images/{i:06d}.png" for i in images]
        return json.dumps({"captions": captions, "images": named}).encode()
    return json.dumps({"captions": captions, "image_ids": images}).encode()


def held(raw: bytes) -> int:
    """Bytes allocated by decoding and checking ``raw`` that the parsed request still holds."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    request = parse_reward(decode_json(raw), Limits())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del request
    return after - before


def main() -> None:
    rng = random.Random(0)
    cases = [
        ("1024 captions of 12 words, image ids", body(1024, 12, rng)),
        ("8192 captions of 60 words, image ids", body(8192, 60, rng)),
        ("8192 captions of 12 words, image paths", body(8192, 12, rng, paths=True)),
        ("8192 one-word captions, image ids", body(8192, 1, rng)),
        ("8192 empty captions of image 1", json.dumps({"captions": [""] * 8192, "image_ids": [1] * 8192}).encode()),
    ]
    for name, raw in cases:
        kept = held(raw)
        print(f"{name}: body {len(raw):,} B, the parsed request holds {kept:,} B: {kept / len(raw):.2f} x")


if __name__ == "__main__":
    main()
