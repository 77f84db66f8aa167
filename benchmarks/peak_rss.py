"""Peak resident memory of the running process (Linux), the one method of the memory benchmarks
(``memory.py``, ``data_memory.py``).

There is no ``torch.cuda.max_memory_allocated`` for the CPU: the kernel keeps the process's peak resident set size
(``VmHWM`` in ``/proc/self/status``), and writing ``5`` to ``/proc/self/clear_refs`` resets that peak to the current
resident size. So :func:`reset_peak` before a piece of work and :func:`peak_bytes` after it, minus the resident size
at the reset, is the most the work added at any moment: every byte really allocated (and touched), Python objects,
tensors and memory-mapped file pages read alike. Measure in a fresh child process, after its imports, so that
nothing else runs in between. :func:`status_kb` reads any other field (``RssAnon``: allocated memory, ``RssFile``:
mapped file pages, which the kernel may drop under pressure).
"""

from __future__ import annotations

from pathlib import Path


def status_kb(field: str) -> int:
    """A field of ``/proc/self/status`` in kB (``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``, ...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> int:
    """Reset the peak resident set (``VmHWM``) to the current one; returns the current resident bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_kb("VmRSS") * 1024


def peak_bytes() -> int:
    """The peak resident bytes since the last :func:`reset_peak` (or since the process started)."""
    return status_kb("VmHWM") * 1024
