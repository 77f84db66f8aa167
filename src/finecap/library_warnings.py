"""Library warnings that say nothing to a finecap user, silenced where finecap drives those libraries: the CLI for
a whole command (:func:`finecap.app.cli.configured_logging`), the Python API for each call
(:class:`finecap.Captioner`), the demo's stage workers for their life (:func:`silence_process`). Silenced for the
duration only where the process is the caller's: nothing stays changed in the caller's logging."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

SILENCED = {
    "transformers.utils.import_utils": ("requires torchvision (not installed); falling back to",),
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community",),
}
"""The warnings, by the logger that emits them (a logger's filter sees only its own records): transformers 5 warns
once per process that ``CLIPImageProcessor`` falls back to its PIL twin without torchvision (every model command
imports it), which is the processor finecap uses either way; bitsandbytes 0.50, imported by peft whenever it is
installed (finecap imports peft where LoRA adapters are made, loaded or saved: :mod:`finecap.models.peft_import`),
warns on CPUs with AVX512-BF16 that the optional ``kernels`` package for its 4-bit CPU matmul is missing, though no
4-bit layer need be in use (with one, it runs its own fallback, which finecap's CPU tests train)."""


class _Silence(logging.Filter):
    def __init__(self, texts: tuple[str, ...]) -> None:
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.texts)


def silence_process() -> None:
    """The warnings of :data:`SILENCED` left out for the rest of this process: for a process finecap owns whole (the
    demo's stage workers, :func:`finecap.stages.pool.worker_setup`), where nothing is the caller's to give back."""
    for name, texts in SILENCED.items():
        logging.getLogger(name).addFilter(_Silence(texts))


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """The warnings of :data:`SILENCED` left out while the block runs.

    Example::

        >>> import logging
        >>> with silenced():
        ...     logging.getLogger("transformers.utils.import_utils").filters[-1].texts[0][:8]
        'requires'
    """
    silences = [(logging.getLogger(name), _Silence(texts)) for name, texts in SILENCED.items()]
    for logger, silence in silences:
        logger.addFilter(silence)
    try:
        yield
    finally:
        for logger, silence in silences:
            logger.removeFilter(silence)
