"""Cost of a step of the judge-backed rewards through the ``openai`` judge: calls, prompt words and seconds, against
a local fake OpenAI-compatible server (tests/helpers/chat_server.py, on 127.0.0.1; it answers at once, so the
seconds are the client's and the HTTP round trips', not a model's).

    nice -n 10 python benchmarks/judge_cost.py [--images 32] [--samples 8] [--shuffles 2] [--concurrency 8]

A step of demo/grpo_qa's shape: ``--images`` world scenes (drawn with seed 0), ``--samples`` captions each (a random
subset of the scene's facts, rendered in the world's grammar). The fake judge answers a question with the letter of
the option the caption names (else "cannot answer"), splits text into words as claims, and says "yes" to a claim the
evidence contains. Measured: ``qa_utility`` (blind filter at set-up, then one step, then the same step again, which
the cache answers) and ``claims`` (one step, references = the scene's full description).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from finecap.boost.world_facts import render_facts
from finecap.judges.base import CANNOT_ANSWER
from finecap.judges.cache import AnswerCache
from finecap.judges.openai import OpenAIJudge
from finecap.judges.questions import scene_questions
from finecap.rewards.claims import ClaimsReward
from finecap.rewards.qa_utility import QAUtilityReward
from finecap.world.facts import scene_facts
from finecap.world.scene import sample_scene

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.chat_server import ChatServer, completion  # noqa: E402  (the test suite's fake server)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402  (benchmarks/machine.py)


def fake_judge(payload, n):
    text, system = payload["messages"][-1]["content"], payload["messages"][0]["content"]
    if "atomic claims" in system:
        return 200, completion(json.dumps(json.loads(re.search(r"Description: (.*)", text).group(1)).split()))
    if "check claims" in system:  # the evidence and the claims are JSON strings, one a line (judge-2 prompts)
        evidence = " ".join(json.loads(e) for e in re.findall(r"^- (.*)$", text.split("Claims:")[0], re.MULTILINE))
        claims = [json.loads(c) for c in re.findall(r"^\d+\. (.*)$", text, re.MULTILINE)]
        return 200, completion(json.dumps(["yes" if c in evidence else "no" for c in claims]))
    caption = re.search(r"Caption: (.*)", text)
    options = re.findall(r"^([A-Z])\. (.*)$", text, re.MULTILINE)
    for letter, option in options:
        if caption and option in json.loads(caption.group(1)):
            return 200, completion(letter)
    return 200, completion(next(letter for letter, option in options if option == CANNOT_ANSWER))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--shuffles", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(0)
    scenes = {i: sample_scene(rng, i) for i in range(args.images)}
    captions, ids = [], []
    for i, scene in scenes.items():
        facts = sorted(scene_facts(scene), key=str)
        for _ in range(args.samples):
            captions.append(render_facts(rng.sample(facts, rng.randint(1, len(facts)))))
            ids.append(i)
    batch = {"image_ids": list(scenes), "image_index": torch.tensor(ids)}
    questions = sum(len(scene_questions(i, s)) for i, s in scenes.items())
    rows = []
    with ChatServer(fake_judge) as server, tempfile.TemporaryDirectory() as tmp:
        judge = OpenAIJudge([server.url], "fake", concurrency=args.concurrency, cache=AnswerCache(Path(tmp) / "c"))

        def measure(name, fn):
            before, words = len(server.requests), sum(_words(r) for r in server.requests)
            start = time.perf_counter()
            fn()
            seconds = time.perf_counter() - start
            calls = len(server.requests) - before
            prompt_words = sum(_words(r) for r in server.requests) - words
            rows.append((name, calls, prompt_words, seconds))

        qa = QAUtilityReward(shuffles=args.shuffles)
        measure("qa_utility: set-up (blind asks)", lambda: qa.prepare(judge, None, scenes))
        measure("qa_utility: one step", lambda: qa(captions, batch))
        measure("qa_utility: the same step again (cached)", lambda: qa(captions, batch))
        refs = {i: [render_facts(scene_facts(s))] for i, s in scenes.items()}
        claims = ClaimsReward(judge, references=refs)
        measure("claims: one step", lambda: claims(captions, batch))
    print(f"{args.images} images x {args.samples} captions = {len(captions)} captions; {questions} questions "
          f"({questions / args.images:.2f} per image), {args.shuffles} shuffles; "
          f"concurrency {args.concurrency}")  # fmt: skip
    print(machine_line())
    print("| what | calls | prompt words | seconds |\n| --- | ---: | ---: | ---: |")
    for name, calls, words, seconds in rows:
        print(f"| {name} | {calls:,} | {words:,} | {seconds:.2f} |")


def _words(request) -> int:
    return sum(len(str(m["content"]).split()) for m in request["payload"]["messages"])


if __name__ == "__main__":
    main()
