"""finecap.train: library pieces of training: checkpoint layout and atomic writes (:mod:`~finecap.train.checkpoint`)
and learning-rate schedules (:mod:`~finecap.train.schedule`). The loop itself is the ``train`` command of the
application layer (:mod:`finecap.app.train`)."""
