"""Adapters from finecap to other tools' interfaces, each over the one reward table (:data:`finecap.registry.REWARDS`)
and each able to ask a reward server (``finecap serve-reward``, :mod:`finecap.serve`) instead of a reward in the
trainer's process: :mod:`~finecap.integrations.trl` (TRL's reward functions), :mod:`~finecap.integrations.verl`
(verl's ``compute_score``), :mod:`~finecap.integrations.swift` (ms-swift's ``ORM`` / ``AsyncORM``),
:mod:`~finecap.integrations.openrlhf` (OpenRLHF's remote reward model and ``reward_func``);
:mod:`~finecap.integrations.scoring` is what they share. Each adapter imports only finecap and the standard library
at import time; the other tool is needed only by the code that runs it. docs/integrations.md has an example per
framework."""
