"""Other tools' interfaces to finecap's metrics, as drop-ins: :mod:`finecap.compat.pycocoevalcap` mirrors
pycocoevalcap's module paths and scorer classes.

For code one can edit, the switch is one import line per scorer::

    from finecap.compat.pycocoevalcap.cider.cider import Cider   # was: from pycocoevalcap.cider.cider import Cider

For code one cannot edit (a toolkit's task files), :func:`install` makes ``import pycocoevalcap...`` resolve to the
drop-in, opt-in and never automatic (importing finecap changes nothing)::

    import finecap.compat
    finecap.compat.install()          # from here on, `pycocoevalcap.bleu.bleu` is finecap.compat's
    ...                               # the toolkit imports pycocoevalcap's classes and scores
    finecap.compat.uninstall()        # the real pycocoevalcap again

    with finecap.compat.installed():  # or only for a block
        ...

:func:`install` puts the drop-in's modules into ``sys.modules`` under pycocoevalcap's names (:data:`ALIASES`):
``pycocoevalcap``, ``.eval``, ``.bleu.bleu``, ``.meteor.meteor``, ``.rouge.rouge``, ``.cider.cider``,
``.spice.spice``, ``.tokenizer.ptbtokenizer`` and their packages. It acts on imports made after it: a module that
already ran ``from pycocoevalcap.bleu.bleu import Bleu`` keeps the class it got. pycocoevalcap's internal modules
(``bleu.bleu_scorer``, ``cider.cider_scorer``, ``spice.get_stanford_models``) have no drop-in: importing one while
installed raises ``ModuleNotFoundError`` (unless it was imported before). pycocoevalcap itself stays installed and
is still read: METEOR's data and SPICE's jars are its files (found on ``sys.path``, never through the aliases).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

__all__ = ["ALIASES", "install", "installed", "is_installed", "uninstall"]

_DROP_IN = "finecap.compat.pycocoevalcap"
ALIASES: dict[str, str] = {
    name: _DROP_IN + name.removeprefix("pycocoevalcap")
    for name in ("pycocoevalcap", "pycocoevalcap.eval", "pycocoevalcap.bleu", "pycocoevalcap.bleu.bleu",
                 "pycocoevalcap.meteor", "pycocoevalcap.meteor.meteor", "pycocoevalcap.rouge",
                 "pycocoevalcap.rouge.rouge", "pycocoevalcap.cider", "pycocoevalcap.cider.cider",
                 "pycocoevalcap.spice", "pycocoevalcap.spice.spice", "pycocoevalcap.tokenizer",
                 "pycocoevalcap.tokenizer.ptbtokenizer")
}  # fmt: skip
"""pycocoevalcap's module names -> the drop-in's modules that :func:`install` puts in their place."""

_saved: dict[str, ModuleType | None] | None = None  # what install() replaced in sys.modules (None: nothing there)


def install() -> None:
    """Make pycocoevalcap's module names import finecap's drop-in (module docstring); a second call does nothing.
    Undone by :func:`uninstall`."""
    global _saved
    if _saved is not None:
        return
    modules = {name: importlib.import_module(target) for name, target in ALIASES.items()}
    _saved = {name: sys.modules.get(name) for name in ALIASES}
    sys.modules.update(modules)


def uninstall() -> None:
    """Put back what :func:`install` replaced in ``sys.modules`` (the real pycocoevalcap modules that had been
    imported; the others are removed, so a later import finds the real package). Does nothing when not installed."""
    global _saved
    if _saved is None:
        return
    for name, module in _saved.items():
        if sys.modules.get(name) is not importlib.import_module(ALIASES[name]):
            continue  # replaced since by someone else: leave it
        if module is None:
            del sys.modules[name]
        else:
            sys.modules[name] = module
    _saved = None


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _saved is not None


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """:func:`install` for the ``with`` block, :func:`uninstall` after it (if it was not installed before)."""
    was = is_installed()
    install()
    try:
        yield
    finally:
        if not was:
            uninstall()
