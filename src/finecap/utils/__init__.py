"""Small shared helpers, a module per job: :mod:`~finecap.utils.files` (atomic writes), :mod:`~finecap.utils.folders`
(folders finecap swaps into place),
:mod:`~finecap.utils.reading` (bounded reads, strict JSON and YAML), :mod:`~finecap.utils.text` (short texts for
messages), :mod:`~finecap.utils.rng` (seeding, random states), :mod:`~finecap.utils.closing` (closing several things),
:mod:`~finecap.utils.once` (notes said once per command),
:mod:`~finecap.utils.system` (CPUs, loopback hosts, extras, progress bars)."""
