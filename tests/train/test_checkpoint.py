import pytest

from finecap.config import load
from finecap.runs import checkpoint_dir, model_dir, temporary_dir
from finecap.train.checkpoint import load_info, save_checkpoint


class TinyModel:
    tokenizer = None  # the captioner contract's member save_checkpoint reads (no tokenizer: no special ids)

    def __init__(self, value, fail=False):
        self.value, self.fail = value, fail

    def save(self, out, state_dict=None):
        out.mkdir(parents=True)
        (out / "weights.txt").write_text(str(self.value))
        if self.fail:
            raise OSError("disk full")


def test_save_layout_and_atomic_replace(tmp_path):
    cfg = load()
    last = checkpoint_dir(tmp_path, "last")
    assert last == tmp_path / "checkpoints" / "last"
    save_checkpoint(last, model=TinyModel(1), cfg=cfg, info={"step": 1})
    assert (last / "model" / "weights.txt").read_text() == "1"
    assert (last / "config.yaml").exists() and load_info(last) == {"step": 1}
    # What was written into the temporary folder first (the loop's accelerate/ state) is kept on request.
    temporary_dir(last).mkdir()
    (temporary_dir(last) / "accelerate").mkdir()
    save_checkpoint(last, model=TinyModel(2), cfg=cfg, info={"step": 2}, keep_tmp_contents=True)
    assert (last / "accelerate").is_dir()
    assert (last / "model" / "weights.txt").read_text() == "2" and load_info(last) == {"step": 2}
    # A save that fails half-way leaves the previous checkpoint intact and no temporary folder behind.
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(last, model=TinyModel(3, fail=True), cfg=cfg, info={"step": 3})
    assert (last / "model" / "weights.txt").read_text() == "2" and load_info(last) == {"step": 2}
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last"]


def test_model_dir_resolution(tmp_path):
    best = checkpoint_dir(tmp_path, "best")
    save_checkpoint(best, model=TinyModel(1), cfg=load(), info={"step": 5})
    assert model_dir(best) == best / "model"
    assert model_dir(best / "model") == best / "model"  # a bare model folder is accepted too
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        model_dir(tmp_path / "missing")
