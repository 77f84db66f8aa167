"""Hostile and broken inputs through the command line (issue 22, items 4 and 8).

- Secrets: with API keys in the configuration (a recipe file and an override) and in the environment, `finecap train`
  (jsonl + TensorBoard trackers), `finecap config` and the demo write the keys nowhere: every file under the run
  folder and everything printed is searched for them.
- Errors: a corpus of bad inputs (damaged checkpoints and optimizer state, folders given for files, files for folders,
  JSON thousands of levels deep, bad bags files, read-only and full disks) each ends in one `finecap: error:` line
  naming the file and exit code 2, never a traceback.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.image_files import png_header
from helpers.tiny_run import KEY_IN_ENV, KEY_IN_OVERRIDE, KEYS

# the fixtures tiny (a tiny world, a tiny random CLIP and the overrides of a 1-layer ClipCap) and secret_run (a
# 2-step training run with an API key in its recipe, another as an override, a third in the environment; jsonl and
# TensorBoard trackers) are tests/conftest.py's (helpers/tiny_run.py)


def files_holding_a_key(folder: Path) -> list[str]:
    files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    return [str(p) for p in files if any(k.encode() in p.read_bytes() for k in KEYS)]


def test_no_secret_in_any_file_of_a_training_run_nor_printed(secret_run):
    run = secret_run["run"]
    written = [p for p in run.rglob("*") if p.is_file()]
    # the places a configuration goes were all written: run and checkpoint config.yaml, TensorBoard hparams, events
    names = {p.name for p in written}
    assert {"config.yaml", "hparams.yml", "metrics.jsonl", "trainer_state.json"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert len([p for p in written if p.name == "config.yaml"]) >= 3  # the run's, checkpoints/best's and last's
    assert files_holding_a_key(run) == []
    assert not any(k in secret_run["printed"] for k in KEYS)
    # the keys were there to leak: masked, not dropped
    hparams = next(p for p in written if p.name == "hparams.yml").read_text()
    assert "boost.llm_api_key: '***'" in hparams and "boost.vlm_api_key: '***'" in hparams
    assert "llm_api_key: '***'" in (run / "config.yaml").read_text()
    code, out, err = secret_run["config"]
    assert code == 0 and "llm_api_key: '***'" in out and "vlm_api_key: '***'" in out
    assert not any(k in out + err for k in KEYS)


def test_no_secret_in_the_demo_folder(tiny, monkeypatch):
    # the demo writes its configuration through the same Config.save as training (its training stages call train);
    # its world stage alone is run here (seconds), with the keys in an override and the environment
    monkeypatch.setenv("OPENAI_API_KEY", KEY_IN_ENV)
    demo = tiny["root"] / "demo"
    world = [o for o in tiny["base"] if o.startswith(("world.", "run.cache_dir"))]
    code, out, err = run_cli(["demo", "--quick", "--stages", "world", "--run-dir", str(demo), *world,
                              f"boost.llm_api_key={KEY_IN_OVERRIDE}"])  # fmt: skip
    assert code == 0, err
    assert (demo / "config.yaml").is_file() and "llm_api_key: '***'" in (demo / "config.yaml").read_text()
    assert files_holding_a_key(demo) == [] and not any(k in out + err for k in KEYS)


# --------------------------------------------------------------------------------------------------------------------
# The corpus of bad inputs
# --------------------------------------------------------------------------------------------------------------------


def _copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


def _truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _eval_inputs(folder: Path) -> tuple[Path, Path]:
    from PIL import Image

    refs = folder / "refs.jsonl"
    refs.write_text(json.dumps({"id": 1, "image": "1.png", "captions": ["a red circle", "a big red circle"]}) + "\n"
                    + json.dumps({"id": 2, "image": "2.png", "captions": ["a blue square"]}) + "\n")  # fmt: skip
    for name in ("1.png", "2.png"):
        Image.new("RGB", (32, 32)).save(folder / name)
    results = folder / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "square"}]))
    return results, refs


DEEP = "[" * 100_000 + "]" * 100_000


def case_truncated_lm_weights(ctx):
    ckpt = _copy_run(ctx.run, ctx.tmp / "r") / "checkpoints" / "best"
    _truncate(ckpt / "model" / "lm" / "model.safetensors")
    argv = ["caption", "--checkpoint", str(ckpt), "--out", str(ctx.tmp / "c.json")]
    return argv, [str(ckpt / "model" / "lm" / "model.safetensors"), "cannot read the weights", "checkpoints/last"]


def case_garbage_mapper_weights(ctx):
    ckpt = _copy_run(ctx.run, ctx.tmp / "r") / "checkpoints" / "best"
    (ckpt / "model" / "mapper.safetensors").write_bytes(b"\x00not safetensors" * 8)
    argv = ["caption", "--checkpoint", str(ckpt), "--out", str(ctx.tmp / "c.json")]
    return argv, [str(ckpt / "model" / "mapper.safetensors"), "cannot read the weights"]


def case_missing_lm_folder(ctx):
    ckpt = _copy_run(ctx.run, ctx.tmp / "r") / "checkpoints" / "best"
    shutil.rmtree(ckpt / "model" / "lm")  # from_pretrained would take the path for a Hub model id
    argv = ["caption", "--checkpoint", str(ckpt), "--out", str(ctx.tmp / "c.json")]
    return argv, [f"{ckpt / 'model' / 'lm'}: no such folder", "Hub model id"]


def case_truncated_optimizer_state(ctx):
    run = _copy_run(ctx.run, ctx.tmp / "r")
    state = run / "checkpoints" / "last" / "state" / "main.safetensors"
    _truncate(state, 50)
    return ["train", *ctx.base, "--out", str(run), "--resume", "train.max_steps=3"], [
        str(state),
        "checkpoints/last.old",
    ]


def case_corrupt_state_json(ctx):
    run = _copy_run(ctx.run, ctx.tmp / "r")
    meta = run / "checkpoints" / "last" / "state" / "main.json"
    meta.write_text("{not json")
    return ["train", *ctx.base, "--out", str(run), "--resume", "train.max_steps=3"], [
        str(meta),
        "checkpoints/last.old",
    ]


def case_checkpoint_is_a_file(ctx):
    argv = ["caption", "--checkpoint", str(ctx.run / "config.yaml"), "--out", str(ctx.tmp / "c.json")]
    return argv, [str(ctx.run / "config.yaml")]


def case_predictions_is_a_folder(ctx):
    results, refs = _eval_inputs(ctx.tmp)
    argv = ["eval", "--predictions", str(ctx.tmp), "--references", str(refs), "--metrics", "bleu"]
    return argv, [f"{ctx.tmp}: is a directory, but a file is expected here"]


def case_eval_out_is_a_folder(ctx):
    results, refs = _eval_inputs(ctx.tmp)
    (ctx.tmp / "out").mkdir()
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu", "--out",
            str(ctx.tmp / "out")]  # fmt: skip
    return argv, [f"{ctx.tmp / 'out'}: is a directory, but a file is expected here"]


def case_recipe_is_a_folder(ctx):
    return ["config", str(ctx.tmp)], [f"{ctx.tmp}: is a directory"]


def case_out_folder_is_a_file(ctx):
    (ctx.tmp / "file").write_text("mine\n")
    argv = ["world", "make", "--out", str(ctx.tmp / "file" / "world"), "--n-train", "2", "--n-val", "1", "--n-test",
            "1", "--image-size", "32"]  # fmt: skip
    return argv, [str(ctx.tmp / "file"), "not a directory"]


def case_deep_json_predictions(ctx):
    results, refs = _eval_inputs(ctx.tmp)
    results.write_text(DEEP)
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu"]
    return argv, [f"{results}: ", "nested too deeply"]


def case_deep_json_references(ctx):
    results, refs = _eval_inputs(ctx.tmp)
    deep = ctx.tmp / "refs.json"
    deep.write_text('{"images": ' + DEEP + "}")
    argv = ["eval", "--predictions", str(results), "--references", str(deep), "--metrics", "bleu"]
    return argv, [f"{deep}: ", "nested too deeply"]


def case_deep_yaml_recipe(ctx):
    recipe = ctx.tmp / "deep.yaml"
    recipe.write_text("train: " + "[" * 20_000 + "]" * 20_000)
    return ["config", str(recipe)], [f"{recipe}: ", "nested too deeply"]


def case_deep_json_in_a_run_folder(ctx):
    run = ctx.tmp / "run"
    run.mkdir()
    (run / "results.json").write_text(DEEP)
    return ["report", str(run)], [f"{run / 'results.json'}: ", "nested too deeply"]


def case_binary_predictions(ctx):
    results, refs = _eval_inputs(ctx.tmp)
    results.write_bytes(b"\xff\xfe\x00\x81 not text")
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu"]
    return argv, [str(results), "UTF-8"]


def case_decompression_bomb_image(ctx):
    # a PNG header declaring 30000 x 30000 pixels, read for CLIPScore (the rest: tests/data/test_image_containment.py)
    results, refs = _eval_inputs(ctx.tmp)
    png_header(ctx.tmp / "1.png", 30000, 30000)
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "clipscore",
            f"retriever.checkpoint={ctx.clip}", f"run.cache_dir={ctx.tmp / 'cache'}"]  # fmt: skip
    return argv, [f"{ctx.tmp / '1.png'}: image too large", "MAX_IMAGE_PIXELS"]


def case_reference_image_outside_its_folder(ctx):
    results, refs = _eval_inputs(ctx.tmp)
    refs.write_text(refs.read_text().replace('"1.png"', '"../1.png"'))
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu"]
    return argv, [f"{refs}, line 1: image path '../1.png'", "data.allow_outside_paths=true"]


def _bags_case(ctx, text: str, expected: str):
    results, refs = _eval_inputs(ctx.tmp)
    bags = ctx.tmp / "bags.json"
    bags.write_text(text)
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bags", "--bags", str(bags),
            f"retriever.checkpoint={ctx.clip}", f"run.cache_dir={ctx.tmp / 'cache'}"]  # fmt: skip
    return argv, [str(bags), expected]


def case_bags_not_json(ctx):
    return _bags_case(ctx, "{not json", "invalid JSON")


def case_bags_a_list(ctx):
    return _bags_case(ctx, "[1, 2, 3]", "expected an object with 'bags'")


def case_bags_bag_of_one(ctx):
    return _bags_case(ctx, json.dumps({"bags": {"3": [{"images": [1]}]}}), "at least two image ids")


def case_bags_size_not_a_number(ctx):
    return _bags_case(ctx, json.dumps({"bags": {"three": [[1, 2]]}}), "not a bag size")


def case_review_bags_is_a_folder(ctx):
    (ctx.tmp / "bags").mkdir()
    return ["bags", "review", str(ctx.tmp / "bags"), "--images", str(ctx.tmp)], [str(ctx.tmp / "bags")]


def case_review_bags_malformed(ctx):
    (ctx.tmp / "bags.json").write_text('{"bags": {"3": "x"}}')
    return ["bags", "review", str(ctx.tmp / "bags.json"), "--images", str(ctx.tmp)], [str(ctx.tmp / "bags.json")]


def _eval_writing(ctx) -> tuple[list[str], Path]:
    results, refs = _eval_inputs(ctx.tmp)
    out = ctx.tmp / "scores" / "eval.json"
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu", "--out", str(out)]
    return argv, out


def _full_disk(ctx) -> None:
    """A patched writer: finecap's every write (finecap.utils.files) fails as on a full disk (the kernel's ENOSPC
    carries no file name)."""
    import finecap.utils.files

    class FullDisk:
        def __init__(self, fd: int, mode: str):
            self.file = os.fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    proxy = type("os_proxy", (), {"__getattr__": lambda self, name: getattr(os, name), "fdopen": FullDisk})()
    ctx.monkeypatch.setattr(finecap.utils.files, "os", proxy)


def case_full_disk_in_a_write(ctx):
    _full_disk(ctx)
    argv, out = _eval_writing(ctx)
    return argv, [str(out.parent), "no space left on device (the disk is full)"]


def case_full_disk_in_a_configured_cache_dir(ctx):
    # the feature cache, the first file `bags build` writes, in a run.cache_dir outside the finecap home: --out does
    # not move it (the message said "write elsewhere (--out)"); run.cache_dir does
    _full_disk(ctx)
    cache = ctx.tmp / "my-cache"
    argv = ["bags", "build", "--split", "test", "--sizes", "2", "--out", str(ctx.tmp / "bags.json"), *ctx.base,
            f"retriever.checkpoint={ctx.clip}", f"run.cache_dir={cache}"]  # fmt: skip
    return argv, [
        f"finecap: error: {cache / 'features'}/",
        "no space left on device (the disk is full); free space or set run.cache_dir to a folder of yours",
    ]


def case_full_disk_in_a_configured_world_out(ctx):
    # a world made at a world.out outside the finecap home: the message said "write elsewhere (--out)" though the
    # command's --out (here none given; `world make --out` is world.out itself) is not what places it; world.out is
    _full_disk(ctx)
    world = ctx.tmp / "my-world"
    argv = ["world", "make", "--n-train", "2", "--n-val", "1", "--n-test", "2", "--image-size", "32",
            f"world.out={world}"]  # fmt: skip
    return argv, [
        f"finecap: error: {world}",
        "no space left on device (the disk is full); free space or set world.out to a folder of yours",
    ]


def case_full_disk_in_a_checkpoint(ctx):
    # safetensors' own writer on a full disk (its message, measured on a 200 KB tmpfs: the OS error without a path)
    from safetensors import SafetensorError

    import finecap.train.state

    def full(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    ctx.monkeypatch.setattr(finecap.train.state, "save_file", full)
    run = ctx.tmp / "run"
    return ["train", *ctx.base, "--out", str(run)], [
        f"{run / 'checkpoints' / 'last' / 'state'}/",
        "no space left on device",
    ]


def case_permission_denied(ctx):
    # a patched writer raising what open() raises in a folder the user may not write to
    import finecap.utils.files

    def denied(dir, prefix, suffix):  # tempfile.mkstemp's keywords as atomic_write_bytes calls it
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(dir, prefix + "k3j_9qz1" + suffix))

    ctx.monkeypatch.setattr(finecap.utils.files.tempfile, "mkstemp", denied)
    argv, out = _eval_writing(ctx)
    # the file, not its temporary name; created, not read
    return argv, [f"{out}: permission denied: this user cannot create it in its folder; write elsewhere (--out)"]


CASES: dict[str, Callable] = {n.removeprefix("case_"): f for n, f in globals().items() if n.startswith("case_")}


class Ctx:
    def __init__(self, tiny, secret_run, tmp_path, monkeypatch):
        self.base, self.clip, self.run = tiny["base"], tiny["clip"], secret_run["run"]
        self.tmp, self.monkeypatch = tmp_path, monkeypatch


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_named_error(case, tiny, secret_run, tmp_path, monkeypatch):
    argv, expected = CASES[case](Ctx(tiny, secret_run, tmp_path, monkeypatch))
    code, out, err = run_cli(argv)
    assert "Traceback" not in err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("finecap: ")]
    assert len(lines) == 1 and lines[0].startswith("finecap: error: "), err
    for fragment in expected:
        assert fragment in lines[0], lines[0]


def _writable_by_this_user(folder: Path) -> bool:
    try:
        (folder / "probe").write_text("")
    except PermissionError:
        return False
    (folder / "probe").unlink()
    return True


def test_read_only_output_folder(tiny, tmp_path):
    results, refs = _eval_inputs(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if _writable_by_this_user(locked):
            pytest.skip("this user (root?) can write into a read-only folder; the patched EACCES case covers it")
        argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu", "--out",
                str(locked / "eval.json")]  # fmt: skip
        code, out, err = run_cli(argv)
        assert code == 2 and err.startswith(f"finecap: error: {locked}") and "permission denied" in err, err
    finally:
        locked.chmod(0o755)


@pytest.fixture
def small_mounts(tmp_path):
    """A full (200 KB) and a read-only tmpfs, when this user may mount (root in a container); else skipped."""
    full, ro = tmp_path / "full", tmp_path / "ro"
    full.mkdir()
    ro.mkdir()
    mounted = []
    for folder, options in ((full, "size=200k"), (ro, "size=64k,ro")):
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                              check=False)  # fmt: skip
        if proc.returncode != 0:
            break
        mounted.append(folder)
    try:
        if len(mounted) < 2:
            pytest.skip("cannot mount a tmpfs here (needs root); the patched-writer cases cover full and read-only")
        yield full, ro
    finally:
        for folder in mounted:
            subprocess.run(["umount", str(folder)], check=False)


def test_real_full_and_read_only_disks(tiny, small_mounts):
    full, ro = small_mounts
    code, out, err = run_cli(["train", *tiny["base"], "--out", str(full / "run")])  # fills 200 KB in a checkpoint
    assert "Traceback" not in err and code == 2, err
    assert f"finecap: error: {full / 'run'}" in err and "no space left on device (the disk is full)" in err, err
    code, out, err = run_cli(["train", *tiny["base"], "--out", str(ro / "run")])
    # refused before anything is made (the run folder's config.yaml cannot be written), naming the option
    said = f"finecap: error: --out: {ro / 'run' / 'config.yaml'}: cannot write in {ro} (read-only file system)"
    assert code == 2 and said in err, err


# --------------------------------------------------------------------------------------------------------------------
# Quiet model commands
# --------------------------------------------------------------------------------------------------------------------

TORCHVISION_WARNING = "requires torchvision (not installed)"
KERNELS_WARNING = "Failed to load CPU gemm_4bit_forward from kernels-community"
USERS_IMPORT = "from transformers import CLIPImageProcessor"
"""A user's own import of the processor class, which warns of torchvision where transformers 5 lacks it."""


def _src_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def warned_here() -> str:
    """The control of the warning tests, one process for the module: what a bare Python (no finecap) prints on
    stderr for a user's ``from transformers import CLIPImageProcessor`` then ``import peft`` (which imports
    bitsandbytes), each its own import and its own warning, whether the libraries warn here at all. The torchvision
    warning is said by the first statement, before peft is imported, so one process answers both tests' controls."""
    control = subprocess.run([sys.executable, "-c", f"{USERS_IMPORT}; import peft"], env=_src_env(),
                             capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return control.stderr


def test_a_bare_import_of_the_modules_making_clip_processors_says_nothing_and_hides_nothing(warned_here):
    """``import finecap.app.bags`` (through finecap.models.world_encoder) printed transformers' torchvision warning,
    which the CLI and the API leave out (finecap.library_warnings): finecap.models.processors names the class that
    ``transformers.CLIPImageProcessor`` resolves to without the import that warns; the warning is not swallowed
    either: the user's own import of that name still prints it."""
    modules = ["finecap.app.bags", "finecap.app.retriever", "finecap.app.report", "finecap.models.presets"]
    if TORCHVISION_WARNING not in warned_here:  # the control: transformers warns here (no torchvision)
        pytest.skip("transformers does not warn of torchvision here (it is installed): nothing to leave out")
    code = f"import sys, {', '.join(modules)}; print('MARK', file=sys.stderr); {USERS_IMPORT}"
    done = subprocess.run([sys.executable, "-c", code], env=_src_env(), capture_output=True, text=True, timeout=300,
                          check=True)  # fmt: skip
    before, _, after = done.stderr.partition("MARK")
    assert TORCHVISION_WARNING not in before, before
    assert TORCHVISION_WARNING in after, after  # the user's own import still says it: nothing swallowed
    import transformers

    from finecap.models.processors import CLIPImageProcessor

    assert CLIPImageProcessor is transformers.CLIPImageProcessor  # the class transformers' own name gives


@pytest.mark.slow
def test_model_command_prints_no_import_warnings_and_q_silences_libraries(secret_run, tiny, warned_here, tmp_path):
    """``finecap caption`` and the Python API print neither library's warning (finecap.library_warnings): on a
    checkpoint with LoRA adapters, whose loading imports peft and with it bitsandbytes (a model without adapters
    imports neither: finecap.models.peft_import)."""
    env = _src_env()
    # the controls (warned_here): whether the libraries warn here
    torchvision_missing = TORCHVISION_WARNING in warned_here  # transformers 5 without torchvision warns here
    kernels_missing = KERNELS_WARNING in warned_here  # bitsandbytes 0.50 on an AVX512-BF16 CPU without `kernels`
    ckpt = secret_run["run"] / "checkpoints" / "best"
    code, _, err = run_cli(["train", *tiny["base"], "lora.lm=true", "lora.rank=4", "--out", str(tmp_path / "lora")])
    assert code == 0, err
    adapted = tmp_path / "lora" / "checkpoints" / "best"
    assert (adapted / "model" / "lm_lora" / "adapter_config.json").is_file()

    def caption(*flags: str, checkpoint: Path = ckpt) -> subprocess.CompletedProcess:
        argv = ["-m", "finecap", "caption", "--checkpoint", str(checkpoint), "--out",
                str(tmp_path / f"c{len(flags)}.json")]  # fmt: skip
        return subprocess.run([sys.executable, *argv, *flags], env=env, capture_output=True, text=True, timeout=300,
                              check=False)  # fmt: skip

    plain, verbose = caption(checkpoint=adapted), caption("-v")
    assert plain.returncode == 0 and verbose.returncode == 0, plain.stderr + verbose.stderr
    assert TORCHVISION_WARNING not in plain.stderr and TORCHVISION_WARNING not in verbose.stderr
    assert KERNELS_WARNING not in plain.stderr and KERNELS_WARNING not in verbose.stderr
    assert "[transformers]" not in plain.stderr  # the libraries at warning level: nothing to say
    assert "[transformers] loading configuration file" in verbose.stderr  # -v: transformers' info messages
    # ... but a whole model config (dozens of lines each) only with -vv: -v keeps a message's first line
    assert "more lines; -vv shows them" in verbose.stderr
    assert '"vocab_size"' not in verbose.stderr, verbose.stderr  # no config body
    very = caption("-vv")
    assert very.returncode == 0 and "more lines; -vv shows them" not in very.stderr and '"vocab_size"' in very.stderr
    assert len(very.stderr.splitlines()) > len(verbose.stderr.splitlines()) + 20
    # the Python API leaves out the same library warnings as the command (finecap.library_warnings)
    api = ("import sys, finecap; c = finecap.Captioner.from_pretrained(sys.argv[1], device='cpu'); "
           "print(len(c.caption([__import__('PIL.Image').Image.new('RGB', (32, 32))])), 'peft' in sys.modules, "
           "'bitsandbytes' in sys.modules)")  # fmt: skip
    used = subprocess.run([sys.executable, "-c", api, str(adapted)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    bnb_installed = importlib.util.find_spec("bitsandbytes") is not None
    assert used.returncode == 0 and used.stdout.split() == ["1", "True", str(bnb_installed)], used.stderr
    assert TORCHVISION_WARNING not in used.stderr and KERNELS_WARNING not in used.stderr, used.stderr
    quiet = caption("-q")
    assert quiet.returncode == 0 and "Loading weights" not in quiet.stderr and "[transformers]" not in quiet.stderr
    if not (torchvision_missing and kernels_missing):
        pytest.skip("torchvision or `kernels` installed, or a CPU without AVX512-BF16: a library gave no warning to "
                    "silence here (the rest was checked)")  # fmt: skip


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_an_error_writing_into_the_finecap_home_names_the_settings_that_move_it(tmp_path, monkeypatch, code):
    """Errors about files in the finecap home (the feature cache, the judges' answers, a world) ended with "write
    elsewhere (--out)", which does not move the home: they name FINECAP_HOME, and the setting that moves that part of
    it (run.cache_dir, world.out) where there is one. A file under a run.cache_dir outside the home names
    run.cache_dir. A file elsewhere keeps --out."""
    from finecap.errors import os_message

    home = tmp_path / "home"
    monkeypatch.setenv("FINECAP_HOME", str(home))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # the tests run as root, who may write anything

    def said(path) -> str:
        return os_message(OSError(code, os.strerror(code), str(path)))

    features = home / "cache" / "features" / ".train-0123456789abcdef.safetensors.k2x9a1zq.tmp"  # being written
    shown = home / "cache" / "features" / "train-0123456789abcdef.safetensors"
    assert said(features).startswith(f"{shown}: ")
    assert "--out" not in said(features)
    assert said(features).endswith(("set FINECAP_HOME (or run.cache_dir) to a folder of yours",
                                    "set FINECAP_HOME (or run.cache_dir) to a folder of yours or change the folder's "
                                    "rights"))  # fmt: skip
    judges = said(home / "cache" / "judges" / "answers.sqlite")
    assert "set FINECAP_HOME to a folder of yours" in judges and "--out" not in judges
    world = said(home / "worlds" / "0123" / "dataset.json")
    assert "set FINECAP_HOME (or world.out) to a folder of yours" in world and "--out" not in world
    assert "write elsewhere (--out)" in said(tmp_path / "out" / "results.json")
    mine = tmp_path / "my-cache"  # a run.cache_dir outside the home: --out does not move it either
    configured = {"run.cache_dir": str(mine)}
    cached = os_message(OSError(code, os.strerror(code), str(mine / "features" / "a.safetensors")), configured)
    assert "set run.cache_dir to a folder of yours" in cached and "--out" not in cached
    assert "write elsewhere (--out)" in os_message(OSError(code, os.strerror(code), str(tmp_path / "x")), configured)
    world = tmp_path / "my-world"  # a world.out outside the home: --out does not move it either
    made = os_message(OSError(code, os.strerror(code), str(world / "images" / "0.png")), {"world.out": str(world)})
    assert "set world.out to a folder of yours" in made and "--out" not in made


def test_a_permission_error_says_whether_the_file_was_read_written_or_created(tmp_path, monkeypatch):
    """One text served every permission error ("read-only file or folder; write elsewhere (--out)"), also for a
    recipe this user cannot read and for a finecap home it cannot write, where --out cannot help. (os.access is
    patched: this machine's tests run as root, who may read anything.)"""
    from finecap.errors import os_message

    mine = tmp_path / "recipe.yaml"
    mine.write_text("train: {}\n")
    denied: dict[str, int] = {str(mine): os.R_OK}
    monkeypatch.setattr(os, "access", lambda path, mode: denied.get(str(path)) != mode)
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    monkeypatch.setenv("FINECAP_HOME", str(home))

    def said(path) -> str:
        return os_message(PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path)))

    assert said(mine).endswith("this user cannot read it; change its permissions (or run as its owner)")
    denied[str(mine)] = os.W_OK
    assert said(mine).endswith("this user cannot write it; write elsewhere (--out) or change its permissions")
    denied.clear()  # the file may be written, its folder not: finecap writes a file anew beside it
    assert said(mine).endswith(
        "cannot replace it in its folder; write elsewhere (--out) or change the folder's rights"
    )
    created = "cannot create it in its folder; {} or change the folder's rights"
    assert said(tmp_path / "new.json").endswith(created.format("write elsewhere (--out)"))
    assert said(home / "cache" / "judges" / "answers.sqlite").endswith(
        created.format("set FINECAP_HOME to a folder of yours"))  # fmt: skip
    assert os_message(FileExistsError(errno.EEXIST, "File exists", str(mine))) == (
        f"{mine}: a file, but a folder is expected here")  # fmt: skip
    # a folder above closed to this user: stat raises (Path.exists raised too on Python 3.11, out of the message)
    closed = tmp_path / "closed" / "recipe.yaml"
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if str(path) == str(closed):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    assert (
        said(closed) == f"{closed}: permission denied: this user cannot reach it (a folder above it is closed to "
        "this user)"
    )
