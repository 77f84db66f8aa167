"""The metrics' two forms: ``f_items(...) -> (corpus, per_item)`` and its twin ``f(...) -> corpus``, which takes the
same arguments. :func:`corpus_only` makes the twin from the first, so that their arguments and defaults are written
once and cannot drift apart.

Example::

    >>> import inspect
    >>> def length_items(captions, unit=1.0):
    ...     per_caption = [unit * len(c.split()) for c in captions]
    ...     return sum(per_caption) / len(per_caption), per_caption
    >>> @corpus_only(length_items)
    ... def mean_length() -> float:
    ...     "Mean caption length in ``unit`` per word."
    >>> mean_length(["a red circle", "a square"], unit=2.0), list(inspect.signature(mean_length).parameters)
    (5.0, ['captions', 'unit'])
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def corpus_only(items: Callable[P, tuple[T, Any]], **fixed: Any) -> Callable[[Callable[..., T]], Callable[P, T]]:
    """Decorator: the decorated function (its body is its docstring; its name and docstring are kept) returns the
    corpus value, the first of ``items(...)``'s pair, and takes ``items``' arguments (its signature is shown as
    ``items``', less ``fixed``: keyword arguments always passed to ``items``)."""
    signature = inspect.signature(items)
    parameters = [p for name, p in signature.parameters.items() if name not in fixed]

    def make(doc: Callable[..., T]) -> Callable[P, T]:
        @functools.wraps(doc)
        def corpus(*args: P.args, **kwargs: P.kwargs) -> T:
            return items(*args, **kwargs, **fixed)[0]

        returns = inspect.signature(doc).return_annotation
        corpus.__signature__ = signature.replace(parameters=parameters, return_annotation=returns)  # type: ignore[attr-defined]
        return corpus

    return make
