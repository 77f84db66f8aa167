"""finecap.train: library pieces of training: the recipe that trains a captioner (:mod:`~finecap.train.run`, which
``finecap train`` and :func:`finecap.api.train` call; this package is callable as that function, see
:mod:`finecap`), what a run needs prepared (:mod:`~finecap.train.prepare`), the engine (:mod:`~finecap.train.engine`),
checkpoints written atomically (:mod:`~finecap.train.checkpoint`; the run-directory layout every reader uses is
:mod:`finecap.runs`), resumable state (:mod:`~finecap.train.state`), the fingerprints that pin a run to its inputs
(:mod:`~finecap.train.fingerprint`) and learning-rate schedules (:mod:`~finecap.train.schedule`)."""
