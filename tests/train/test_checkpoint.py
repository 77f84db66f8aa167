import errno
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from finecap.config import load
from finecap.runs import INFO_FILE, checkpoint_dir, model_dir, temporary_dir
from finecap.train.checkpoint import load_info, save_checkpoint
from finecap.train.state import find_resumable, is_complete, new_checkpoint_folder, read_info
from helpers.config_yaml import count_renders, rendered_afresh
from helpers.killed_removal import Killed, KilledRmtree


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


def test_a_run_renders_its_configurations_yaml_once_for_all_its_checkpoints(tmp_path, monkeypatch):
    """A run saves its configuration with each checkpoint, unchanged: PyYAML's pure-Python emitter rendered it for
    each (~5 ms of CPU, a third of a tiny ClipCap's save); now once, each ``config.yaml`` what a fresh rendering
    writes."""
    renders = count_renders(monkeypatch)
    cfg = load(None, [f"run.dir={tmp_path}"])  # a configuration no other test rendered
    for step, name in enumerate(["last", "best", "last", "last"]):
        save_checkpoint(checkpoint_dir(tmp_path, name), model=TinyModel(step), cfg=cfg, info={"step": step})
    assert len(renders) == 1
    expected = rendered_afresh(cfg).encode()
    assert [(checkpoint_dir(tmp_path, n) / "config.yaml").read_bytes() for n in ("last", "best")] == [expected] * 2


class _SavesAnLm(TinyModel):
    """A captioner whose save holds a transformers model's folder, ``lm/``, with the ``generation_config.json`` its
    ``save_pretrained`` writes (ClipCap's): settings of its own that the checkpoint's file keeps."""

    def save(self, out, state_dict=None):
        from transformers import GenerationConfig

        super().save(out, state_dict)
        GenerationConfig(bos_token_id=3, eos_token_id=4, repetition_penalty=1.05).save_pretrained(out / "lm")


def test_a_save_renders_its_generation_configs_only_to_save_them(tmp_path, monkeypatch):
    """transformers renders a whole ``GenerationConfig`` (``to_json_string``: deep copies, a default config, JSON) to
    write it and to hash it: a tiny ClipCap's save rendered its two configs 9 times (2-3 ms), 3 of them for nothing:
    ``lm/``'s file was read back with ``from_pretrained``, whose ``from_dict`` renders it for a log line (an f-string,
    at every level) and which hashes it, and copied with ``from_dict`` (the log line again). Now every rendering is
    one of ``save_pretrained``'s own, and the files are byte for byte what ``from_pretrained``'s reading gives."""
    from transformers import GenerationConfig

    from finecap.train.checkpoint import generation_config

    real_render, real_save = GenerationConfig.to_json_string, GenerationConfig.save_pretrained
    inside, outside = [0], []

    def render(self, *args, **kwargs):
        if not inside[0]:
            outside.append(args or kwargs)
        return real_render(self, *args, **kwargs)

    def save(self, *args, **kwargs):
        inside[0] += 1
        try:
            return real_save(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(GenerationConfig, "to_json_string", render)
    monkeypatch.setattr(GenerationConfig, "save_pretrained", save)
    cfg = load()
    last = checkpoint_dir(tmp_path / "run", "last")
    save_checkpoint(last, model=_SavesAnLm(1), cfg=cfg, info={"step": 1})
    assert outside == []
    # the lm's file as transformers' own loader reads the file the model's save wrote (its repetition penalty off)
    model = _SavesAnLm(1)
    model.save(tmp_path / "theirs")
    base = GenerationConfig.from_pretrained(tmp_path / "theirs" / "lm")
    generation_config(cfg.decode, None, base).save_pretrained(tmp_path / "expected")
    written = (last / "model" / "lm" / "generation_config.json").read_bytes()
    assert written == (tmp_path / "expected" / "generation_config.json").read_bytes()
    assert json.loads(written)["bos_token_id"] == 3 and json.loads(written)["repetition_penalty"] == 1.0


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_a_swap_whose_last_rename_fails_puts_the_previous_checkpoint_back(tmp_path, monkeypatch, error):
    """The swap renames ``last`` to ``last.old``, then ``.last.tmp`` to ``last``; when that second rename failed, the
    previous checkpoint stayed behind as ``last.old`` (readers warned of a killed run, ``finecap caption`` of the run
    read it under that name) and the complete new one was removed. Now the previous one is put back as ``last``."""
    import finecap.utils.files

    cfg = load()
    last = checkpoint_dir(tmp_path, "last")
    save_checkpoint(last, model=TinyModel(1), cfg=cfg, info={"step": 1})
    before = {p.relative_to(last): p.read_bytes() for p in sorted(last.rglob("*")) if p.is_file()}

    def replace(src, dst):
        if Path(src) == temporary_dir(last):
            raise OSError(error, os.strerror(error), str(src))
        os.replace(src, dst)

    proxy = type(
        "os_proxy", (), {"__getattr__": lambda self, name: getattr(os, name), "replace": staticmethod(replace)}
    )
    monkeypatch.setattr(finecap.utils.files, "os", proxy())  # the swap's renames: replace_durably
    with pytest.raises(OSError, match=os.strerror(error)):
        save_checkpoint(last, model=TinyModel(2), cfg=cfg, info={"step": 2})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last"]
    assert {p.relative_to(last): p.read_bytes() for p in sorted(last.rglob("*")) if p.is_file()} == before


def resumable_save(last: Path, step: int) -> None:
    """A resumable save as the loop makes it: ``state/`` written into ``.last.tmp`` first, then the checkpoint."""
    tmp = temporary_dir(last)
    new_checkpoint_folder(tmp)
    (tmp / "state").mkdir(exist_ok=True)
    (tmp / "state" / "main.json").write_text("{}")
    save_checkpoint(last, model=TinyModel(step), cfg=load(), info={"step": step}, keep_tmp_contents=True)


def test_a_save_killed_while_cleaning_up_a_failed_swap_leaves_nothing_a_resume_picks(tmp_path, monkeypatch):
    """The swap of a complete ``.last.tmp`` (``trainer_state.json`` written: the commit point) fails, and its cleanup
    is killed half-way (a second Ctrl-C). Its ``rmtree`` deleted part of ``model/`` and left ``trainer_state.json``
    and ``state/``: the resume took ``.last.tmp`` for the newest complete checkpoint (step 2) and failed to load it.
    Now ``trainer_state.json`` goes first, and the resume takes ``last`` (step 1)."""
    import finecap.utils.files

    last = checkpoint_dir(tmp_path, "last")
    resumable_save(last, 1)

    def replace(src, dst):
        if Path(src) == temporary_dir(last):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
        os.replace(src, dst)

    proxy = type(
        "os_proxy", (), {"__getattr__": lambda self, name: getattr(os, name), "replace": staticmethod(replace)}
    )
    monkeypatch.setattr(finecap.utils.files, "os", proxy())  # the swap's renames: replace_durably
    monkeypatch.setattr(shutil, "rmtree", KilledRmtree())
    with pytest.raises(Killed):
        resumable_save(last, 2)
    monkeypatch.undo()
    tmp = temporary_dir(last)
    assert (tmp / "state").is_dir() and len(list((tmp / "model").iterdir())) > 0  # killed half-way through it
    assert not is_complete(tmp)
    assert find_resumable(tmp_path) == last and read_info(last)["step"] == 1


def test_a_swap_killed_while_removing_the_previous_checkpoint_leaves_it_incomplete(tmp_path, monkeypatch):
    """The same rule for the swapped-out ``last.old``, a folder a resume also looks at: killed while it is
    removed, it no longer reads complete."""
    last = checkpoint_dir(tmp_path, "last")
    resumable_save(last, 1)
    monkeypatch.setattr(shutil, "rmtree", KilledRmtree())
    with pytest.raises(Killed):
        resumable_save(last, 2)
    monkeypatch.undo()
    old = last.with_name("last.old")
    assert (old / "state").is_dir() and not is_complete(old)
    assert find_resumable(tmp_path) == last and read_info(last)["step"] == 2


def test_model_dir_resolution(tmp_path):
    best = checkpoint_dir(tmp_path, "best")
    save_checkpoint(best, model=TinyModel(1), cfg=load(), info={"step": 5})
    assert model_dir(best) == best / "model"
    assert model_dir(best / "model") == best / "model"  # a bare model folder is accepted too
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        model_dir(tmp_path / "missing")


def strict(text: str):
    """``json.loads`` refusing Python's ``NaN`` / ``Infinity`` tokens, as ``jq`` and JavaScript do."""

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


BEST_INFO = {"step": 4, "best_value": 0.5, "best_step": 4, "metric": "CIDEr-D"}


def test_a_best_checkpoints_non_finite_validation_values_are_strict_json_and_read_back(tmp_path):
    # trainer_state.json held bare NaN / Infinity tokens (a validation value that is no number: a diverged loss,
    # SPICE's NaN), which jq and JavaScript refuse
    best = checkpoint_dir(tmp_path, "best")
    values = {"CIDEr-D": 0.5, "loss": float("inf"), "SPICE": float("nan"), "margin": float("-inf")}
    save_checkpoint(best, model=TinyModel(1), cfg=load(), info={**BEST_INFO, "values": values})
    written = strict((best / INFO_FILE).read_text())
    assert written["values"] == {"CIDEr-D": 0.5, "loss": None, "SPICE": None, "margin": None}
    assert written["nonfinite"] == {"loss": "Infinity", "SPICE": "NaN", "margin": "-Infinity"}
    for info in (load_info(best), read_info(best)):  # the values as validated, the encoding's key gone
        assert "nonfinite" not in info and info["values"]["CIDEr-D"] == 0.5
        assert (info["values"]["loss"], info["values"]["margin"]) == (math.inf, -math.inf)
        assert math.isnan(info["values"]["SPICE"])


def test_a_trainer_state_written_with_bare_tokens_still_reads(tmp_path):
    best = checkpoint_dir(tmp_path, "best")
    save_checkpoint(best, model=TinyModel(1), cfg=load(), info=BEST_INFO)
    (best / INFO_FILE).write_text(json.dumps({**BEST_INFO, "values": {"loss": float("inf"), "SPICE": float("nan")}}))
    assert "Infinity" in (best / INFO_FILE).read_text()  # the old form, as finecap wrote it before
    for info in (load_info(best), read_info(best)):
        assert info["values"]["loss"] == math.inf and math.isnan(info["values"]["SPICE"])


# --------------------------------------------------------------------------------------------------------------------
# A checkpoint loaded by one process while the training run swaps a new one in
# --------------------------------------------------------------------------------------------------------------------

PAUSED_READER = """
import json, sys
from finecap.models import backbones, strict
real = strict.load_module_state

def paused(module, file):  # ClipCap reads its LM first, then its mapper
    print("lm loaded", flush=True)
    sys.stdin.readline()  # the test says when to go on
    return real(module, file)

strict.load_module_state = paused
model = backbones.load_captioner(sys.argv[1])
print(json.dumps({part: float(sum(p.detach().double().sum() for p in getattr(model, part).parameters()))
                  for part in ("lm", "mapper")}), flush=True)
"""


def _sums(model) -> dict[str, float]:
    parts = {part: getattr(model, part).parameters() for part in ("lm", "mapper")}
    return {part: float(sum(p.detach().double().sum() for p in params)) for part, params in parts.items()}


@pytest.mark.slow
def test_a_checkpoint_loading_in_another_process_is_never_swapped_under_it(make_cfg, tmp_path):
    # a load of RUN/checkpoints/best (finecap caption / eval of a run still training) read the LM of one save and
    # the mapper of the next when training swapped a new best in between: a mixed model, silently
    import json
    import logging
    import subprocess
    import sys
    import threading

    import torch

    from finecap.models.backbones import load_captioner
    from finecap.models.clipcap import ClipCap

    cfg = make_cfg()
    model = ClipCap.build(cfg)
    best = checkpoint_dir(tmp_path / "run", "best")
    save_checkpoint(best, model=model, cfg=cfg, info={"step": 1})
    old = _sums(load_captioner(best / "model"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next best, every weight another
    reader = subprocess.Popen([sys.executable, "-c", PAUSED_READER, str(best / "model")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    said = threading.Event()  # the saver waited, or it finished
    waited = []

    class Waiting(logging.Handler):
        def emit(self, record):
            if "waiting for another process to finish loading" in record.getMessage():
                waited.append(record.getMessage())
                said.set()

    runs_log = logging.getLogger("finecap.runs")
    handler, level = Waiting(), runs_log.level
    runs_log.addHandler(handler)
    runs_log.setLevel(logging.INFO)

    def save():
        try:
            save_checkpoint(best, model=model, cfg=cfg, info={"step": 2})
        finally:
            said.set()

    saver = threading.Thread(target=save)
    try:
        assert reader.stdout.readline() == "lm loaded\n"  # the reader has read the old LM, not yet the mapper
        saver.start()  # the training run saves its next best now
        assert said.wait(120)
        assert waited, "the new best was swapped in while another process was loading the old one"
        out, _ = reader.communicate("go\n", timeout=120)
        saver.join(120)
    finally:
        runs_log.removeHandler(handler)
        runs_log.setLevel(level)
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0 and json.loads(out) == old  # one checkpoint's LM and mapper, both the old one's
    new = _sums(load_captioner(best / "model"))
    assert load_info(best) == {"step": 2} and new["lm"] != old["lm"] and new["mapper"] != old["mapper"]


def test_generate_with_the_saved_generation_config_ignores_the_bases_own_penalties(tmp_path):
    # Qwen2-VL-Instruct's generation_config.json holds repetition_penalty 1.05; a run's saved file kept it (base's
    # other settings are kept), so generate with it penalised repeats that finecap's decoder writes: 2 of these 4
    # greedy captions differed (3 of 4 with no_repeat_ngram_size 2 as well)
    from PIL import Image
    from transformers import GenerationConfig

    from finecap.config import DecodeConfig
    from finecap.models.vlm import Vlm
    from finecap.train.checkpoint import write_generation_config
    from helpers.vlm_families import tiny_family

    model, processor = tiny_family("qwen2_vl")
    model.generation_config.update(repetition_penalty=1.05, no_repeat_ngram_size=2)
    vlm = Vlm(model, processor, source="tiny-qwen2_vl").eval()
    model.generation_config.save_pretrained(tmp_path)  # what the model's save_pretrained writes into model/
    cfg = DecodeConfig(strategy="greedy", max_length=12)
    write_generation_config(tmp_path, cfg, vlm.tokenizer, vlm.end_token_ids)
    saved = GenerationConfig.from_pretrained(tmp_path)
    assert (saved.repetition_penalty, saved.no_repeat_ngram_size) == (1.0, 0)

    g = torch.Generator().manual_seed(1)
    images = [[Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy())] for _ in range(4)]
    enc = dict(processor(text=[vlm.prompt_text] * 4, images=images, padding=True, return_tensors="pt"))
    ours = vlm.generate(enc | {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]}, cfg)
    with torch.no_grad():  # the model's own settings still hold the penalties: the saved ones must turn them off
        theirs = model.generate(**enc, generation_config=saved)[:, enc["input_ids"].shape[1] :]
    for row, seq in enumerate(theirs.tolist()):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n], row


def test_an_edited_generation_config_setting_finecap_cannot_apply_is_named(tmp_path, caplog):
    # docs/caption.md: an edited generation_config.json is honoured; a setting finecap's decoder has no counterpart
    # for (a repetition penalty added by hand, another tool's file) was dropped without a word
    from transformers import GenerationConfig

    from finecap.config import DecodeConfig
    from finecap.train.checkpoint import decode_of_folder, write_generation_config

    write_generation_config(tmp_path, DecodeConfig(strategy="beam", beam_size=3, max_length=9))
    with caplog.at_level("WARNING", logger="finecap.train.checkpoint"):
        assert decode_of_folder(tmp_path)["beam_size"] == 3
    assert caplog.records == []  # finecap's own file sets every such setting off
    edited = GenerationConfig.from_pretrained(tmp_path)
    edited.update(repetition_penalty=1.2, no_repeat_ngram_size=3)
    edited.save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="finecap.train.checkpoint"):
        assert decode_of_folder(tmp_path)["beam_size"] == 3
    (record,) = caplog.records
    assert str(tmp_path / "generation_config.json") in record.getMessage()
    assert "no_repeat_ngram_size=3, repetition_penalty=1.2" in record.getMessage()


def test_a_sampling_file_without_top_k_samples_as_generate_does(tmp_path):
    # another tool's generation_config.json with do_sample and no top_k: generate samples with top_k 50
    # (transformers' default), finecap read 0 (the whole vocabulary); finecap's own file keeps its 0
    from transformers import GenerationConfig

    from finecap.config import DecodeConfig
    from finecap.train.checkpoint import decode_of_folder, write_generation_config

    GenerationConfig(do_sample=True, temperature=0.7).save_pretrained(tmp_path / "theirs")
    assert "top_k" not in (tmp_path / "theirs" / "generation_config.json").read_text()
    theirs = decode_of_folder(tmp_path / "theirs")
    assert (theirs["strategy"], theirs["top_k"], theirs["temperature"]) == ("sample", 50, 0.7)
    write_generation_config(tmp_path / "ours", DecodeConfig(strategy="sample", top_k=0))
    assert decode_of_folder(tmp_path / "ours")["top_k"] == 0
