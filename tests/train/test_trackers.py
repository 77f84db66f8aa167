"""``finecap train ... train.grad_accum_steps=N train.log_with=[jsonl,tensorboard]`` from the command line: the
TensorBoard event file is read back (scalars per step, captions as text), and the JSONL log matches it."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import types
from pathlib import Path

import pytest
from accelerate.utils import LoggerType

from finecap.app.cli import main
from finecap.config import TRACKERS, ConfigError, load
from finecap.home import run_path


def test_tracker_names_are_accelerates():
    assert set(TRACKERS) - {"jsonl"} == {t.value for t in LoggerType} - {"all"}
    with pytest.raises(ConfigError, match="train.log_with.*unknown tracker 'tensorbored'"):
        load(None, ["train.log_with=[tensorbored]"])


def test_tensorboard_and_jsonl_with_accumulation(make_cfg, tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator", reason="tensorboard is a test dependency"
    )
    cfg = make_cfg()  # the tiny-world overrides, as a command line
    keys = (
        "out",
        "n_train",
        "n_val",
        "n_test",
        "image_size",
        "encoder",
        "tiny_layers",
        "tiny_hidden",
        "tiny_heads",
        "prefix_length",
        "dir",
        "cache_dir",
    )
    items = [f"{section}.{key}={value}" for section, values in cfg.to_dict().items() for key, value in values.items()
             if section in ("world", "model", "clipcap", "run") and key in keys]  # fmt: skip
    code = main(["train", *items, "train.max_steps=4", "train.batch_size=8", "train.grad_accum_steps=2",
                 "train.log_every=2", "train.eval_every=4", "train.log_captions=2", "decode.max_length=8",
                 "train.log_with=[jsonl,tensorboard]"])  # fmt: skip
    assert code == 0
    run_dir = run_path(cfg.run)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_events = [e for e in events if e["split"] == "train"]
    assert [e["step"] for e in train_events] == [2, 4]
    # 200 captions in global batches of 8 x 2 accumulation steps = 16 -> 13 optimizer steps per epoch
    assert train_events[0]["epoch"] == pytest.approx(round(2 / 13, 4))
    val = next(e for e in events if e["split"] == "val")
    assert val["step"] == 4 and len(val["text"]["captions"].splitlines()) == 2
    assert val["epoch"] == train_events[1]["epoch"] == pytest.approx(round(4 / 13, 4))  # the step's, in both

    logdirs = [p.parent for p in (run_dir / "trackers").rglob("events.out.tfevents.*")]
    assert logdirs, "no TensorBoard event file under <run>/trackers"
    acc = event_accumulator.EventAccumulator(str(logdirs[0]), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "val/loss"} <= set(scalars)
    # step 4 logs training and validation values: its epoch once (until 2026-11-29 twice, a duplicate point)
    assert [e.step for e in acc.Scalars("epoch")] == [2, 4]
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in loss] == [2, 4]
    for (_, value), event in zip(loss, train_events, strict=True):
        assert value == pytest.approx(event["values"]["loss"], rel=1e-6)
    texts = [t for t in acc.Tags()["tensors"] if "captions" in t]
    assert texts, f"no caption text in TensorBoard (tensors: {acc.Tags()['tensors']})"
    logged = acc.Tensors(texts[0])[0].tensor_proto.string_val[0].decode()
    assert logged.splitlines()[0].split(": ", 1)[1] == val["text"]["captions"].splitlines()[0].split(": ", 1)[1]


def test_a_resumed_run_shows_each_step_once_in_tensorboard(make_cfg):
    # killed after step 5, resumed from the step-3 checkpoint: the killed run's events of steps 4-5 stayed in its
    # event file and the resumed run logged them again, so TensorBoard showed steps 1, 2, 3, 4, 5, 4, 5, 6
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator", reason="tensorboard is a test dependency"
    )
    from finecap.train.run import train
    from helpers.resume import Killed, kill_at, train_events
    from helpers.waiting import until

    cfg = make_cfg("train.max_steps=6", "train.save_every=3", "train.eval_every=3",
                   "train.log_with=[jsonl,tensorboard]")  # fmt: skip
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(5)])
    # TensorBoard reads a folder's event files in name order, and a name starts with the second it was made: a resume
    # within the killed run's second (only a test is that quick) could sort before it, as under the parallel suite
    (first,) = (Path(cfg.run.dir) / "trackers" / "finecap").glob("events.out.tfevents.*")
    until(lambda: int(time.time()) > int(first.name.split(".")[3]), "the clock did not pass the first file's second",
          timeout=5, every=0.05)  # fmt: skip
    run_dir = train(cfg, resume=True)
    acc = event_accumulator.EventAccumulator(str(run_dir / "trackers" / "finecap"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    logged = [(e.step, pytest.approx(e.value, rel=1e-6)) for e in acc.Scalars("train/loss")]
    assert logged == train_events(run_dir)  # the resumed run's values, as metrics.jsonl holds them
    assert [e.step for e in acc.Scalars("val/loss")] == [3, 6]


def test_a_tracker_that_is_not_installed_is_refused_before_training(make_cfg, monkeypatch):
    import accelerate.tracking

    from finecap.train.run import train

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [LoggerType.TENSORBOARD])
    cfg = make_cfg("train.max_steps=1", "train.log_with=[jsonl,wandb,mlflow]")
    with pytest.raises(ValueError, match=r"train.log_with: wandb, mlflow not installed \(pip install wandb mlflow\)"):
        train(cfg)  # accelerate dropped them with a debug message: the run logged nothing there


def test_trackers_start_under_the_run_folder_and_see_the_command_line_masked(make_cfg, monkeypatch, tmp_path):
    """wandb, dvclive and swanlab wrote into the working directory (accelerate gives only tensorboard and aim a
    folder), and wandb recorded sys.argv unmasked: an API key given as an override reached its run file."""
    import sys

    import accelerate
    import accelerate.tracking

    from finecap.train.run import train

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: list(LoggerType))
    for env in ("WANDB_DIR", "DVCLIVE_DIR", "SWANLAB_LOG_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(env, raising=False)
    seen = {}

    def init_trackers(self, project_name, config=None, init_kwargs=None):  # records instead of starting them
        seen.update(argv=list(sys.argv), kwargs=init_kwargs, mlflow=os.environ.get("MLFLOW_TRACKING_URI"))

    monkeypatch.setattr(accelerate.Accelerator, "init_trackers", init_trackers)
    monkeypatch.setattr(sys, "argv", ["finecap", "train", "boost.vlm_api_key=sk-SECRET-1", "train.lr=1e-3"])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = make_cfg("train.max_steps=1", "train.log_with=[jsonl,wandb,dvclive,swanlab,mlflow]")
    run = train(cfg)
    assert seen["argv"] == ["finecap", "train", "boost.vlm_api_key=***", "train.lr=1e-3"]
    assert sys.argv[2] == "boost.vlm_api_key=sk-SECRET-1"  # given back afterwards
    trackers = run / "trackers"
    assert seen["kwargs"] == {"wandb": {"dir": str(trackers)}, "dvclive": {"dir": str(trackers / "dvclive")},
                              "swanlab": {"logdir": str(trackers / "swanlab")}}  # fmt: skip
    assert list(cwd.iterdir()) == []  # nothing in the working directory
    # mlflow reads its URI at every call: set while the run lasts, given back after (a next run gets its own)
    assert seen["mlflow"] == f"sqlite:///{(trackers / 'mlflow.db').resolve()}"
    assert "MLFLOW_TRACKING_URI" not in os.environ
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "mine"))  # the user's own placement wins
    from finecap.train.logging import placed_trackers

    with placed_trackers(["wandb"], trackers) as places:
        assert "wandb" not in places


def test_an_empty_mlflow_uri_is_placed_in_the_run_and_left_empty_after(tmp_path, monkeypatch):
    # mlflow reads MLFLOW_TRACKING_URI="" as unset (./mlruns): the run places it, and gives the variable back as it
    # was, not removed (the next run in the process, or the user's notebook, sees what it set)
    from finecap.train.logging import MLFLOW_DB, placed_trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    with placed_trackers(["mlflow"], tmp_path / "trackers"):
        assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{(tmp_path / 'trackers' / MLFLOW_DB).resolve()}"
    assert os.environ["MLFLOW_TRACKING_URI"] == ""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mine:5000")  # the user's server wins, and stays
    with placed_trackers(["mlflow"], tmp_path / "trackers"):
        assert os.environ["MLFLOW_TRACKING_URI"] == "http://mine:5000"
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://mine:5000"


MLFLOW_NAME = re.compile(r"^[/\w.\- :]*$")
"""The metric names mlflow takes (mlflow 3.17's ``mlflow.utils.validation.validate_param_and_metric_name``)."""


def fake_mlflow(logged: list[tuple[int, dict]]) -> types.ModuleType:
    """An ``mlflow`` module with what accelerate's tracker calls, failing as mlflow does (verified with mlflow 3.17
    and a real run): a metric name outside :data:`MLFLOW_NAME` is refused, and the file store (a ``file:`` tracking
    URI, ``mlruns/<experiment>/<run>/metrics/<name>`` one file per metric) cannot keep a metric under a name that is
    another's file (``train/loss`` and ``train/loss/mle``: ``Not a directory``)."""
    files: set[str] = set()

    def log_metrics(metrics, step=None):
        for name in metrics:
            if not MLFLOW_NAME.match(name):
                raise ValueError(f"Invalid value \"{name}\" for parameter 'metrics.name'")
            nested = any(name.startswith(f"{f}/") or f.startswith(f"{name}/") for f in files)  # a file as a folder
            if nested and os.environ["MLFLOW_TRACKING_URI"].startswith("file:"):
                raise NotADirectoryError(f"[Errno 20] Not a directory: '.../metrics/{name}'")
            files.add(name)
        logged.append((step, dict(metrics)))

    module = types.ModuleType("mlflow")
    module.search_experiments = lambda filter_string=None: []
    module.create_experiment = lambda name, artifact_location=None, tags=None: "1"
    module.start_run = lambda **kwargs: types.SimpleNamespace(info=None)
    module.log_params = lambda params: None
    module.log_metrics = log_metrics
    module.end_run = lambda *args, **kwargs: None
    module.utils = types.SimpleNamespace(
        validation=types.SimpleNamespace(MAX_PARAM_VAL_LENGTH=6000, MAX_PARAMS_TAGS_PER_BATCH=100)
    )
    return module


def test_mlflow_receives_every_logged_value_under_a_name_it_takes(make_cfg, monkeypatch):
    # mlflow in <run>/trackers was its file store, which fails at the first event (train/loss beside
    # train/loss/mle); in a database the retrieval validator's val/r@1 stopped training at the first evaluation
    import accelerate.tracking

    from finecap.train.run import train

    logged: list[tuple[int, dict]] = []
    monkeypatch.setitem(sys.modules, "mlflow", fake_mlflow(logged))
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: list(LoggerType))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = make_cfg("train.max_steps=2", "train.eval_every=2", "train.validators=[retrieval]",
                   "train.log_with=[jsonl,mlflow]")  # fmt: skip
    run_dir = train(cfg)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # every event's numbers, keyed as mlflow has them (r@1 -> r_at_1), at its step, with the epoch at the step's
    # first event only (step 2's validation event comes after its training event: one epoch point per step)
    expected = [(e["step"], {**({"epoch": e["epoch"]} if i == 0 or events[i - 1]["step"] != e["step"] else {}),
                             **{f"{e['split']}/{k}".replace("@", "_at_"): v for k, v in e["values"].items()}})
                for i, e in enumerate(events)]  # fmt: skip
    assert logged == expected
    assert [step for step, values in logged if "epoch" in values] == [1, 2]
    assert "val/r_at_1" in logged[-1][1]


def test_trackers_are_finished_when_training_stops_with_an_error(make_cfg, monkeypatch):
    # an mlflow or wandb run left active by a failed training fails the next one in the same process
    from finecap.train.engine import Engine
    from finecap.train.logging import JsonlTracker
    from finecap.train.run import train

    finished = []

    class Recording(JsonlTracker):
        def finish(self):
            finished.append(self.path)

    monkeypatch.setattr("finecap.train.engine.JsonlTracker", Recording)

    def fails(self):
        raise RuntimeError("the step failed")

    monkeypatch.setattr(Engine, "fit", fails)
    with pytest.raises(RuntimeError, match="the step failed"):
        train(make_cfg("train.max_steps=1"))
    assert len(finished) == 1


def test_the_jsonl_tracker_writes_a_non_finite_value_as_strict_json(tmp_path):
    # metrics.jsonl held Python's bare NaN / Infinity tokens (a reward nothing scored, a diverged loss), which jq,
    # JavaScript's JSON.parse and strict parsers refuse: now null, with its kind named in "nonfinite".
    from finecap.report.plots import read_events
    from finecap.train.logging import JsonlTracker
    from helpers.metrics_log import NEW_FORM, OLD_FORM, same, strict_rows

    nan, inf = float("nan"), float("inf")
    tracker = JsonlTracker(tmp_path / "metrics.jsonl")
    tracker.log({"train/loss": inf, "train/reward": nan, "train/lr": 0.1, "epoch": 0.1}, step=1)
    tracker.log({"val/cider_d": nan, "val/loss": -inf, "val/captions": "0: a cat", "epoch": 0.2}, step=2)
    tracker.log({"train/loss": 2.5, "train/reward": 0.25, "train/lr": 0.1, "epoch": 0.3}, step=3)
    written = (tmp_path / "metrics.jsonl").read_text()
    rows = strict_rows(written)
    assert rows[0]["values"] == {"loss": None, "reward": None, "lr": 0.1}
    assert rows[0]["nonfinite"] == {"loss": "Infinity", "reward": "NaN"} and "nonfinite" not in rows[2]
    assert written == NEW_FORM
    (tmp_path / "old.jsonl").write_text(OLD_FORM)
    back = read_events(tmp_path / "metrics.jsonl")
    assert same(back, read_events(tmp_path / "old.jsonl")) and back[1]["values"]["loss"] == -inf
