"""finecap.train: library pieces of training: the engine (:mod:`~finecap.train.engine`), checkpoints written atomically
(:mod:`~finecap.train.checkpoint`; the run-directory layout every reader uses is :mod:`finecap.runs`), resumable state
(:mod:`~finecap.train.state`), the fingerprints that pin a run to its inputs (:mod:`~finecap.train.fingerprint`) and
learning-rate schedules (:mod:`~finecap.train.schedule`). The captioner's recipe around the engine is the ``train``
command of the application layer (:mod:`finecap.app.train`)."""
