"""The English stemmer of the METEOR 1.5 jar: Snowball's English (Porter2) algorithm as ``snowballstemmer`` 2.x has it.

The jar stems with a compiled Snowball English stemmer of its time. Compared on 108,909 words (the paraphrase
vocabulary, the WordNet lemmas and irregular forms), the pure-Python ``snowballstemmer`` 1.2.1-2.2.0 stems every one
alike; ``snowballstemmer`` 3.x and PyStemmer stem 198 of them otherwise (the jar and 2.x stem ``evening`` to
``even``, ``added`` to ``ad``, ``organization`` to ``organ``; 3.x to ``evening``, ``add``, ``organiz``), and NLTK's
``SnowballStemmer`` 18. finecap therefore pins
``snowballstemmer>=2.2,<3`` and imports its pure-Python ``EnglishStemmer`` class directly: the package's factory
``snowballstemmer.stemmer("english")`` silently returns PyStemmer's C stemmer whenever PyStemmer is installed, so
installing another package could change METEOR's scores.

Example::

    >>> stem = Stemmer()
    >>> stem("running"), stem("added"), stem("adds"), stem("evening")
    ('run', 'ad', 'add', 'even')
"""

from __future__ import annotations

from snowballstemmer.english_stemmer import EnglishStemmer

__all__ = ["Stemmer"]


class Stemmer:
    """``stem(word) -> stem``, memoised (the pure-Python stemmer takes ~20 us a word)."""

    def __init__(self) -> None:
        self._stemmer = EnglishStemmer()
        self._cache: dict[str, str] = {}

    def __call__(self, word: str) -> str:
        out = self._cache.get(word)
        if out is None:
            out = self._cache[word] = self._stemmer.stemWord(word)
        return out
