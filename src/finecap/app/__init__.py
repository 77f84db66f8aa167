"""finecap's application layer: one module per command, wiring the library together.

Arrows point from here down into the library (``finecap.data``, ``models``, ``decode``, ``objectives``, ``rewards``,
``metrics``, ``world``, ``report``), never back: no library module imports ``finecap.app``.
"""
