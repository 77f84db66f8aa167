"""Files and folders finecap writes get the modes the user's umask gives (issue 21, item 5): ``0o666 & ~umask`` for
files, ``0o777 & ~umask`` for folders, whatever path they take (``mkstemp`` creates 0600 files, ``mkdtemp`` 0700
folders). Each umask runs in a fresh interpreter started with that umask, as a user's shell would start finecap."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from finecap.utils import files

# Writes, under the umask the process was started with: a JSON file (results), report-like text (HTML), a
# safetensors feature-cache file (atomic_write_bytes), a whole checkpoint of a tiny ClipCap (safetensors weights,
# tokenizer, config; built in a temporary folder and renamed into place) and a folder built with make_temporary_dir
# (mkdtemp) and renamed into place. Prints the umask seen before and after, so the parent can check it is unchanged.
SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    out, clip = Path(sys.argv[1]), sys.argv[2]
    before = os.umask(0o022); os.umask(before)

    from finecap.config import load
    from finecap.utils.files import atomic_write_text, make_temporary_dir, write_json
    from finecap.utils.folders import atomic_replace_dir

    write_json(out / "results.json", {"mle": {"CIDEr-D": 1.0}})
    atomic_write_text(out / "report" / "report.html", "<html><body>report</body></html>")

    import torch
    from finecap.data.features import cached_tensor
    cached_tensor(out / "cache" / "features.safetensors", {"n": "2"}, lambda: torch.ones(2, 3))

    from finecap.models.backbones import build_model
    from finecap.runs import checkpoint_dir
    from finecap.train.checkpoint import save_checkpoint
    cfg = load(None, [f"model.encoder={clip}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
                      "clipcap.tiny_heads=2", "clipcap.prefix_length=2"])
    save_checkpoint(checkpoint_dir(out / "run", "best"), model=build_model(cfg), cfg=cfg, info={"step": 1})

    tmp = make_temporary_dir(out / "encoder")
    write_json(tmp / "encoder.json", {"key": "x"})
    atomic_replace_dir(tmp, out / "encoder")

    after = os.umask(0o022); os.umask(after)
    from finecap.utils.files import current_umask
    print(before, after, current_umask())
    """
)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    from finecap.models.presets import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("clip"), image_size=32, patch_size=16)


def modes(root: Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of every file and folder under ``root`` (``root`` included)."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_written_files_follow_the_umask(tmp_path, clip, mask):
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777 & ~mask)  # the folder the user points finecap at, made under the same umask
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(clip)], capture_output=True, text=True,
                          umask=mask, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after, read = (int(v) for v in proc.stdout.split()[-3:])
    assert before == after == read == mask  # read once, and the process umask left as it was
    found = modes(out)
    names = set(found)
    # What was written, so that the mode checks below cover every kind of file the issue names.
    assert {"results.json", "report/report.html", "cache/features.safetensors", "encoder/encoder.json"} <= names
    assert "run/checkpoints/best/config.yaml" in names
    assert any(n.startswith("run/checkpoints/best/model/") and n.endswith(".safetensors") for n in names)
    assert not any(".tmp" in n for n in names)  # no temporary file or folder left behind
    for name, mode in found.items():
        kind = "dir" if (out / name).is_dir() else "file"
        expected = (0o777 if kind == "dir" else 0o666) & ~mask
        assert mode == expected, f"{name} ({kind}): mode {oct(mode)}, expected {oct(expected)} under umask {oct(mask)}"
    if mask == 0o022:  # the everyday case, spelled out: readable by everyone, writable by the owner
        assert found["results.json"] == 0o644 and found["encoder"] == 0o755


def test_umask_fallback_restores_the_process_umask(monkeypatch, tmp_path):
    # Without /proc (macOS), the umask is read by setting one and putting the old one back: the value is right and
    # the process keeps its umask.
    monkeypatch.setattr(files, "PROC_STATUS", str(tmp_path / "no-such-file"))
    files._umask_by_setting.cache_clear()
    old = os.umask(0o027)
    try:
        assert files.current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # unchanged by the read
        assert files.file_mode() == 0o640 and files.dir_mode() == 0o750
        files.write_json(tmp_path / "x.json", {"a": 1})
        assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o640
        assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1}
    finally:
        os.umask(old)
        files._umask_by_setting.cache_clear()


def test_a_umask_changed_during_the_process_is_followed(tmp_path):
    """A notebook that sets another umask between two calls: finecap's files follow it, as open() does (the mask
    was read once per process, so a later umask 077 still gave 0644 files)."""
    old = os.umask(0o022)
    try:
        files.write_json(tmp_path / "a.json", {"a": 1})
        os.umask(0o077)
        files.write_json(tmp_path / "b.json", {"b": 1})
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o600
