"""A run folder is data, never code: a checkpoint whose ``captioner.json`` names a backbone by dotted path (one's own
backbone) makes finecap import that module only when the user named it (``model.kind`` of the configuration being
trained, or ``FINECAP_TRUSTED_CODE``); a tampered ``captioner.json`` is refused before any import, naming the
file and how to name the backbone (:func:`finecap.models.backbones.stored_backbone`)."""

from __future__ import annotations

import json
import sys

import pytest

from finecap.models.backbones import TRUST_ENV, checkpoint_kind, external_encoder, load_captioner, stored_backbone
from finecap.runs import CheckpointError


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on ``sys.path`` whose import writes a marker file, and a checkpoint folder naming a class of it."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_backbone.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    monkeypatch.delenv("FINECAP_TRUSTED_BACKBONES", raising=False)  # the variable's former name, still read
    sys.modules.pop("planted_backbone", None)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "captioner.json").write_text(json.dumps({"kind": "planted_backbone:Evil"}))
    yield ckpt, marker
    sys.modules.pop("planted_backbone", None)


@pytest.mark.parametrize("read", [
    lambda ckpt: checkpoint_kind(ckpt),
    lambda ckpt: load_captioner(ckpt),
    lambda ckpt: external_encoder(json.loads((ckpt / "captioner.json").read_text())),
    lambda ckpt: checkpoint_kind(ckpt, trusted=("other_module:Evil",)),
], ids=["checkpoint_kind", "load_captioner", "external_encoder", "another_kind_trusted"])  # fmt: skip
def test_an_untrusted_dotted_kind_is_refused_before_any_import(planted, read):
    ckpt, marker = planted
    with pytest.raises(CheckpointError, match=r"names the backbone 'planted_backbone:Evil'.*FINECAP_TRUSTED_CODE"):
        read(ckpt)
    assert not marker.exists() and "planted_backbone" not in sys.modules


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_named_dotted_kind_is_imported_and_still_checked_to_be_a_captioner(planted, monkeypatch, how):
    ckpt, marker = planted
    trusted = ("planted_backbone:Evil",) if how == "argument" else ()
    if how == "environment":
        monkeypatch.setenv(TRUST_ENV, "x.y:Z, planted_backbone:Evil")
    with pytest.raises(ValueError, match="is not a captioner class"):
        stored_backbone("planted_backbone:Evil", ckpt / "captioner.json", trusted)
    assert marker.exists()  # named by the user: imported, then refused as not a CaptionerBase


def test_a_registered_kind_needs_no_trust(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    (tmp_path / "captioner.json").write_text(json.dumps({"kind": "vlm"}))
    assert checkpoint_kind(tmp_path) == "vlm"
