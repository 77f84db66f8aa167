"""Typed configuration: one dataclass per section, loaded from YAML with dotlist overrides.

Every field has a default, a one-line doc and its own bounds (``doc(...)``). ``load("recipe.yaml", ["train.lr=1e-4"])``
returns a :class:`Config`; unknown sections or keys, values of the wrong type and values outside a ``Literal`` or a
field's bounds raise :class:`ConfigError` naming the key (and the file) and the valid choices or range. Cross-field
checks live in each section's ``__post_init__`` and name the override key to change.

The package, split by reason:

- :mod:`~finecap.config.fields`: :class:`ConfigError`, :func:`doc` and the one loop checking every field's bounds;
- :mod:`~finecap.config.sections`: the sections and :class:`Config`;
- :mod:`~finecap.config.loading`: coercion, origins, overrides, did-you-mean, :func:`load`, :func:`from_dict`;
- :mod:`~finecap.config.hf_names`: Hugging Face's names of the options, suggested by the errors of unknown keys;
- :mod:`~finecap.config.stored`: configurations finecap stored, migrated keys, :func:`load_stored`;
- :mod:`~finecap.config.paths`: the keys holding paths, made absolute when stored;
- :mod:`~finecap.config.secrets`: the keys holding secrets and their masking.

Example::

    >>> cfg = load(None, ["world.n_train=200", "train.objective=mle"])
    >>> cfg.world.n_train
    200
"""

from finecap.config.fields import ConfigError, doc
from finecap.config.loading import (
    Origins,
    check_names,
    describe,
    did_you_mean,
    flat_options,
    from_dict,
    load,
    masked_override,
    merge_overrides,
    override_key,
    parse_override,
    renamed_override,
    replaced_section,
)
from finecap.config.paths import KEYWORDS, PATH_KEYS, absolute_path_values, absolute_paths
from finecap.config.secrets import MASK, SECRET_KEYS, masked_url_secrets, masked_url_values, redacted
from finecap.config.sections import *  # noqa: F403 - the sections, Config and the Literal types of the options
from finecap.config.sections import __all__ as _sections
from finecap.config.stored import load_stored, migrate_moved_keys, with_added_keys

__all__ = [
    "KEYWORDS",
    "MASK",
    "PATH_KEYS",
    "SECRET_KEYS",
    "ConfigError",
    "Origins",
    "absolute_path_values",
    "absolute_paths",
    "check_names",
    "describe",
    "did_you_mean",
    "doc",
    "flat_options",
    "from_dict",
    "load",
    "load_stored",
    "masked_override",
    "masked_url_secrets",
    "masked_url_values",
    "merge_overrides",
    "migrate_moved_keys",
    "override_key",
    "parse_override",
    "redacted",
    "renamed_override",
    "replaced_section",
    "with_added_keys",
    *_sections,
]
