"""Keys that moved between sections (:data:`MOVED_KEYS`) and where each is read now."""

from __future__ import annotations

import dataclasses

MOVED_KEYS: dict[str, str] = {
    "model.lm": "clipcap.lm",
    "model.mapper": "clipcap.mapper",
    "model.prefix_length": "clipcap.prefix_length",
    "model.mapper_layers": "clipcap.mapper_layers",
    "model.mapper_heads": "clipcap.mapper_heads",
    "model.blip": "blip.name",
    "model.vlm": "vlm.name",
    "model.vlm_prompt": "vlm.prompt",
    "model.vlm_train_projector": "vlm.train_projector",
    **{f"model.tiny_{k}": f"{{kind}}.tiny_{k}" for k in ("layers", "hidden", "heads", "dropout")},
    **{
        f"rl.{k}": f"grpo.{k}"
        for k in (
            "advantage",
            "scale_rewards",
            "reward_aggregation",
            "policy_loss",
            "iterations",
            "clip_low",
            "clip_high",
            "importance",
            "loss_aggregation",
            "kl_coef",
            "kl_bias_correction",
        )
    },  # fmt: skip
    **{f"rl.{k}": f"sle.{k}" for k in ("alpha", "distance", "diversity_baseline")},
    **{f"data.{k}": f"data.hf.{k}" for k in ("image_column", "caption_column", "split_column", "id_column")},
}
"""Keys of the former flat ``model`` and ``rl`` sections and where they live now (``{kind}``: the section of
``model.kind``, as each backbone has its own world-tiny sizes). A former ``model`` key in a recipe or override is an
error naming the new key; a former ``rl`` key (the GRPO family's and SLE's options, split into the ``grpo`` and
``sle`` sections) and a former ``data`` key (the ``hf`` format's columns, now the ``data.hf`` subsection) is read as
its new key wherever it is set (:func:`renamed_key`: recipes, overrides and commands written before the move keep
working, and say so in one warning). A stored configuration written before either move is migrated
(:func:`finecap.config.stored.migrate_moved_keys`); no fingerprint reads these keys (:mod:`finecap.train.fingerprint`
pins the data and encoders), so a run's fingerprints are the same before and after."""


ADDED_KEYS: dict[str, object] = {
    "data.jpeg_draft": False,
}
"""Keys added after finecap first stored configurations whose default is not what the finecap before them did, with
the value that behaviour is: a configuration finecap stored (:meth:`~finecap.config.sections.Config.save` writes every
key of a section) whose section lacks the key was written before it existed, and reads it as this value
(:func:`finecap.config.stored.with_added_keys`), so an old run captions, evaluates and resumes as it trained. Before
``data.jpeg_draft`` JPEGs were decoded at full size (``false``); its default ``true`` gives pixels about one grey
level apart (docs/data.md)."""


RENAMED_SECTIONS = ("rl", "data")
"""Sections whose moved keys (:data:`MOVED_KEYS`) are read under their new name wherever they are set."""


def renamed_key(key: str) -> str | None:
    """The key a former key ``section.name`` of a :data:`RENAMED_SECTIONS` section is read as, else ``None``.

    >>> renamed_key("rl.advantage"), renamed_key("rl.alpha"), renamed_key("rl.samples")
    ('grpo.advantage', 'sle.alpha', None)
    >>> renamed_key("data.image_column")
    'data.hf.image_column'
    """
    return MOVED_KEYS.get(key) if key.split(".")[0] in RENAMED_SECTIONS else None


def moved_key(key: str, kind: str) -> str | None:
    """The key ``key`` of the former flat ``model`` section moved to for a captioner of ``model.kind=kind``, or
    ``None`` when ``key`` did not move or that backbone has no such option (the world VLM has no dropout).

    Example::

        >>> moved_key("model.prefix_length", "clipcap"), moved_key("model.tiny_hidden", "blip")
        ('clipcap.prefix_length', 'blip.tiny_hidden')
    """
    target = MOVED_KEYS.get(key, "").replace("{kind}", kind)
    if not target:
        return None
    section, _, name = target.partition(".")  # a dotted-path kind ('pkg.mod:Class') names no section
    from finecap.config.sections import SECTIONS  # the assembled sections (the package imports this module first)

    cls = SECTIONS.get(section)
    return target if cls is not None and name in {f.name for f in dataclasses.fields(cls)} else None
