"""Settings shared by the tests (``tests/``) and the docstring examples of ``src/finecap`` (``make doctest``, their
own run: ``pytest --doctest-modules src/finecap``).

It sits at the repository root because it is the one conftest both trees see; it is not part of the package. The
tests' shared code is the package ``tests/helpers/``, imported as ``helpers.*`` (pyproject.toml's ``pythonpath``).

- One torch thread per test process (the machine has 2 cores and the models are tiny), and in the processes the
  tests start (``OMP_NUM_THREADS=1`` unless set): ``make test`` keeps both cores busy with its two workers, so a
  second thread in a test's subprocess only competes with the other worker (the quick demo beside a busy core:
  95 s and 110 CPU-seconds with two threads, 74 s and 88 with one, docs/benchmarks.md).
- One temporary finecap home for the whole session (:func:`finecap_home`), so nothing is written to ``~/.cache``,
  and one temporary folder (:func:`session_tmpdir`), so nothing is left in ``/tmp``.
- The names the docstring examples use (:func:`doctest_namespace`): tiny models built here from configs with random
  or fixed weights, saved into temporary folders as a Hub checkpoint would be, never downloaded. An example reads as
  a user would write it (``Retriever.from_pretrained(clip_dir)`` where a user writes a Hub name) and shows what these
  models really compute.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported, here and in the processes tests start
os.environ.setdefault("FINECAP_FSYNC", "0")  # atomic writes unsynced (tests/utils/test_durable_writes.py syncs)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory):
    """The temporary folder of every test and docstring example of the session and of the processes they start
    (``TMPDIR``): a folder under pytest's own, which pytest prunes, so that what they leave there (the examples'
    ``tempfile.mkdtemp()`` folders, torch elastic's logs of the runs tests launch) does not pile up in ``/tmp``."""
    folder = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(folder))
        mp.setattr(tempfile, "tempdir", str(folder))  # tempfile's cached choice, made before this fixture ran
        yield folder


@pytest.fixture(scope="session", autouse=True)
def finecap_home(tmp_path_factory):
    """``FINECAP_HOME`` for every test of the session (and the processes they start): a temporary folder holding
    the worlds, world encoders and caches of commands run with the defaults (``world.out``, ``run.cache_dir``
    empty)."""
    home = tmp_path_factory.mktemp("finecap-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_HOME", str(home))
        yield home


def _uniform_lm(out: Path) -> Path:
    """A tiny GPT-2 over the world tokenizer whose every weight is zero, saved with its tokenizer into ``out``: its
    logits are all zero, so it gives each of the V tokens of its vocabulary probability 1/V (perplexity V)."""
    from transformers import GPT2LMHeadModel

    from finecap.models.presets import world_gpt2_config
    from finecap.models.tokenizer import world_tokenizer

    tokenizer = world_tokenizer()
    lm = GPT2LMHeadModel(world_gpt2_config(tokenizer, layers=1, hidden=8, heads=2, n_positions=16))
    with torch.no_grad():
        for p in lm.parameters():
            p.zero_()
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _records(out: Path) -> list[Any]:
    """Three one-colour 32x32 images (red, blue, green) as records with ids 0, 1, 2 and one caption each."""
    from PIL import Image

    from finecap.data.records import Record

    records = []
    for i, (colour, rgb) in enumerate([("red", (220, 30, 30)), ("blue", (30, 30, 220)), ("green", (30, 200, 30))]):
        path = out / f"{i}.png"
        Image.new("RGB", (32, 32), rgb).save(path)
        records.append(Record(i, path, "test", [f"a {colour} square"]))
    return records


@pytest.fixture(scope="session")
def doctest_namespace(tmp_path_factory) -> dict[str, Any]:
    """The names the docstring examples of ``src/finecap`` use besides their module's own:

    - ``clip_dir``: a folder holding a tiny random ``CLIPModel`` (seed 0) with the world tokenizer and a
      ``CLIPImageProcessor`` (:func:`finecap.models.presets.save_tiny_clip`), where a user names a Hub checkpoint;
    - ``retriever``: that checkpoint loaded (:class:`finecap.models.retriever.Retriever`);
    - ``records``: three one-colour images (ids 0 red, 1 blue, 2 green) and ``image``, the red one opened;
    - ``cache_dir``: an empty temporary folder for feature caches;
    - ``lm_dir``: a tiny GPT-2 whose weights are all zero, with the world tokenizer (:func:`_uniform_lm`).

    Built once per session, only when a doctest runs (only doctests request this fixture).
    """
    from PIL import Image

    from finecap.models.presets import save_tiny_clip
    from finecap.models.retriever import Retriever

    root = tmp_path_factory.mktemp("doctest")
    clip_dir = save_tiny_clip(root / "tiny-clip", seed=0)
    (root / "images").mkdir()
    records = _records(root / "images")
    (root / "cache").mkdir()
    return {
        "clip_dir": clip_dir,
        "retriever": Retriever.from_pretrained(clip_dir),
        "records": records,
        "image": Image.open(records[0].path),
        "cache_dir": root / "cache",
        "lm_dir": _uniform_lm(root / "uniform-lm"),
    }
