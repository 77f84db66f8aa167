"""finecap.train: the one training loop (:mod:`~finecap.train.loop`), checkpoints (:mod:`~finecap.train.checkpoint`)
and learning-rate schedules (:mod:`~finecap.train.schedule`)."""
