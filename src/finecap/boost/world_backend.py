"""The ``world`` backends: Visual Caption Boosting's exact analogue on the embedded world.

- :class:`WorldLLM` answers the text steps from facts (:mod:`finecap.boost.world_facts`): ``blend`` renders the
  union of the facts of the human captions; ``holistic`` renders BlendCap's facts plus the VisualCap facts that
  conflict with no human-stated fact. Prompts are ignored (the world has no language model to instruct).
- :class:`WorldVLM` is a real, noisy visual expert: a ClipCap captioner trained on the world's dense captions
  (``finecap train demo/visual_expert``; every fact of a scene in one caption), decoding greedily. Its mistakes are
  that model's own errors, measured by faithfulness against the scene graphs, never injected.

**Where these differ from the paper's prompts** (NDLB appendix A.1, shipped as ``boost.prompts=ndlb``), and why:

- *No prompt, no few-shot examples.* Neither backend reads ``boost.prompts``: the world has no instruction-tuned
  model, so each step does exactly what its paper prompt asks instead of asking a model to do it. The world is
  where the method can be measured without a language model's own errors; the COCO recipes run the paper's prompts.
- *BlendCap* is every fact the human captions state, rendered once ("incorporating relevant information from all the
  reference captions", "minimizes redundancy", "do not include additional information"). The paper's "Stop after the
  first period" is not imitated: the rendering is one caption of whatever length the facts need.
- *VisualCap*: the paper asks InstructBLIP to "Briefly describe the content of the image."; the world's expert was
  trained on dense captions, so it describes every fact it sees. In the paper that "brief" description still
  averages 51.1 words, longer than HolisticCap's 41.5 (Table 9): its role is to bring the fine details the humans
  left out, which a brief caption of a world scene would not.
- *HolisticCap* adds the visual facts that conflict with no human fact and keeps the human version where they do
  ("strictly use information from Correct caption"); the paper leaves "conflict" to the LLM, the world states it
  as rules (:mod:`finecap.boost.world_facts`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.boost.engine import Task, weights_stamp
from finecap.boost.world_facts import blend_facts, holistic_facts, render_facts
from finecap.world.facts import facts

if TYPE_CHECKING:
    from finecap.config import Config


class WorldLLM:
    """Exact BlendCap / HolisticCap from the world's fact parser and grammar."""

    def identity(self) -> dict[str, Any]:
        """The cache key's backend: ``version`` changes with the answers (2: positions and relations conflict)."""
        return {"backend": "world-llm", "version": 2}

    def answer(self, task: Task) -> str:
        human = blend_facts(task.inputs["captions"])
        if task.step == "blend":
            return render_facts(human)
        if task.step == "holistic":
            return render_facts(holistic_facts(facts(task.inputs["blend"]), facts(task.inputs["visual"]), human))
        raise ValueError(f"the world LLM answers the blend and holistic steps, not {task.step!r}")

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        for i, task in enumerate(tasks):
            yield i, self.answer(task)


def expert_hint(path: Path, cfg: Config) -> str:
    """What makes the visual expert ``boost.vlm_model`` names: the recipe into that run folder (``finecap train
    demo/visual_expert`` alone writes ``<runs root>/demo/visual_expert``, which is named when it is there)."""
    from finecap.home import runs_root

    made = runs_root(cfg.run) / "demo" / "visual_expert" / "checkpoints" / "best"
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
    how = f"train one with `finecap train demo/visual_expert run.dir={run_dir}`" if run_dir else "name a checkpoint"
    found = f"; `finecap train demo/visual_expert` wrote one: boost.vlm_model={made}" if made.exists() else ""
    return f"{how} (or set boost.vlm_backend){found}"


class WorldVLM:
    """The visual expert: a captioner checkpoint (``boost.vlm_model``; the demo's is a ClipCap) decoding greedily,
    up to ``data.max_tokens`` tokens (dense captions reach 41), on the frozen-feature cache of ``cfg``. A checkpoint
    whose weights were trained with SMILE's first-token shifting writes its captions without the shift token
    (:func:`finecap.models.first_token.start_shift`: its ``captioner.json``'s record, or its run's configuration),
    and its :meth:`identity` names the shift."""

    def __init__(self, checkpoint: str | Path, cfg: Config, batch_size: int = 256) -> None:
        from finecap.models.backbones import load_captioner
        from finecap.models.first_token import start_shift, unshift_as
        from finecap.runs import model_dir, reading_checkpoint

        path = Path(checkpoint)
        if not path.exists():
            hint = expert_hint(path, cfg)
            raise FileNotFoundError(f"boost.vlm_model: visual expert checkpoint {path} not found; {hint}")
        with reading_checkpoint(path) as found:  # the stamp, the weights and the shift one save's (a run training)
            self.path = model_dir(found)
            self.weights = weights_stamp(self.path, ("*.safetensors",))  # read once: the identity of every request
            self.model = load_captioner(self.path).eval()  # any backbone's checkpoint (the demo trains a ClipCap)
            unshift_as(self.model, start_shift(found))  # its captions without the shift token of SMILE-shifted weights
        self.cfg = cfg
        limit = self.model.max_caption_tokens or 10**6
        self.decode = dataclasses.replace(
            cfg.decode, strategy="greedy", max_length=min(cfg.data.max_tokens, limit), num_return_sequences=1,
            batch_size=batch_size,
        )  # fmt: skip

    def identity(self) -> dict[str, Any]:
        shift = self.model.first_token_shift  # named only when set: an unshifted expert's answers keep their keys
        return {"backend": "world-vlm", "checkpoint": str(self.path.resolve()), "weights": self.weights,
                "decode": dataclasses.asdict(self.decode),
                **({"first_token_shift": shift} if shift else {})}  # fmt: skip

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        import torch

        from finecap.data.features import model_features

        by_split: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(tasks):
            by_split[t.record.split].append(i)
        for split, positions in by_split.items():
            records = [tasks[i].record for i in positions]
            features = model_features(self.model, records, self.cfg, split)  # (N, D)
            size = self.decode.batch_size
            for start in range(0, len(positions), size):
                with torch.no_grad():
                    texts = self.model.generate(features[start : start + size], self.decode).texts
                yield from zip(positions[start : start + size], texts)
