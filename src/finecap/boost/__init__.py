"""Visual Caption Boosting (NDLB Sec. 2): BlendCap, VisualCap and HolisticCap through LLM/VLM backends.

- :mod:`~finecap.boost.prompts`: the three steps' chat prompts, few-shot examples, prompt files (``ndlb``: the
  paper's own, ``ndlb_prompts.yaml``);
- :mod:`~finecap.boost.engine`: the resumable answer cache, retries of malformed answers, the failure budget and
  failure log, the steps over a data set;
- backends: :mod:`~finecap.boost.openai_backend` (OpenAI-compatible HTTP servers; the model their replies name
  checked by :mod:`~finecap.boost.served_model`, as the judges' servers are),
  :mod:`~finecap.boost.vllm_backend` (an in-process ``vllm.LLM``), :mod:`~finecap.boost.hf_backend` (in-process
  ``transformers`` chat models; both in-process backends share :mod:`~finecap.boost.chat`),
  :mod:`~finecap.boost.world_backend` (the embedded world's exact analogue, with :mod:`~finecap.boost.world_facts`);
  :mod:`~finecap.boost.backends` picks one by name;
- :mod:`~finecap.boost.output`: the boosted data set in the source's format, and the checks of every output path
  (one writer per output folder: :mod:`finecap.locks`).

Failure handling, exit codes, the lock, keys and prompts: ``docs/boost.md``.

The ``finecap boost`` command is :mod:`finecap.app.boost`.
"""
