"""A tiny world, a fabricated run directory (results, captions, logs, bags), a real tiny GRPO run of ``finecap
train`` and a headless Chromium for the report and review tests."""

import json
from pathlib import Path

import pytest
import yaml

from finecap.config import WorldConfig, load
from finecap.data.formats.world import read_world
from finecap.data.results import write_results
from finecap.world.make import make_world
from helpers.browser import loaded


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    cfg = WorldConfig(n_train=6, n_val=3, n_test=12, image_size=40, seed=5)
    return make_world(cfg, tmp_path_factory.mktemp("world") / "w", progress=False)


def _events(losses: list[float], lengths: list[float]) -> str:
    lines = []
    for k, (loss, length) in enumerate(zip(losses, lengths, strict=True), 1):
        lines.append({"step": 4 * k, "epoch": 0.1 * k, "split": "train", "values": {"loss": loss, "lr": 1e-3}})
        lines.append({"step": 4 * k, "split": "val", "values": {"length": length, "R@1": 0.1 * k}})
    return "".join(json.dumps(e) + "\n" for e in lines)


@pytest.fixture(scope="session")
def fabricated_run(tiny_world, tmp_path_factory) -> Path:
    """A run directory as `finecap demo` writes one, with made-up numbers for stages human, mle, smile, smile_random,
    and a stage `blip_x` that no headline names (the report must show it anyway)."""
    run = tmp_path_factory.mktemp("run")
    test = [r for r in read_world(tiny_world) if r.split == "test"]
    ids = [r.image_id for r in test]
    captions = {
        "human": {r.image_id: r.captions[0] for r in test},
        "mle": {i: "a red circle" for i in ids},
        "smile": {i: "a large red striped circle on the left above a blue square on grass" for i in ids},
        "blip_x": {i: "a shape" for i in ids},
    }
    for stage, caps in captions.items():
        write_results(run / "captions" / f"{stage}.json", caps)
    results = {
        "human": {"Length": 8.5, "faith/precision": 1.0, "faith/recall": 0.4, "bag3/R@1": 0.7, "bag5/R@1": 0.6},
        "mle": {
            "Length": 3.0,
            "faith/precision": 0.9,
            "faith/recall": 0.2,
            "bag3/R@1": 0.5,
            "bag5/R@1": 0.4,
            "sample/Div-2": 0.6,
        },
        "smile": {"Length": 13.0, "faith/precision": 0.8, "faith/recall": 0.5, "bag3/R@1": 0.8, "bag5/R@1": 0.7},
        "blip_x": {"Length": 2.0, "transfer/acc": 0.3},
    }
    (run / "results.json").write_text(json.dumps(results))
    for stage, lengths in {"mle": [3, 3], "smile": [6, 12], "smile_random": [3, 3.5]}.items():
        (run / stage).mkdir()
        (run / stage / "metrics.jsonl").write_text(_events([3.0, 2.5], lengths))
    bags = {"data": str(tiny_world / "dataset.json"),
            "bags": {"3": [{"images": ids[0:3], "similarity": 0.9}, {"images": ids[3:6], "similarity": 0.8}],
                     "5": [{"images": ids[6:11], "similarity": 0.7}]}}  # fmt: skip
    (run / "bags_test.json").write_text(json.dumps(bags))
    cfg = load(None, [f"world.out={tiny_world}"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return run


GRPO_TINY = ["train.init_from=", "train.max_steps=4", "train.batch_size=8", "train.eval_every=2",
             "train.eval_samples=4", "train.log_every=1", "train.log_captions=4", "decode.max_length=8",
             "decode.beam_size=2", "rl.samples=3", "eval.n_distractors=3"]  # fmt: skip
"""``demo/grpo_sr_cider`` made tiny: from scratch, 4 steps of 8 images x 3 samples, 2 evaluations logging 4
captions each."""


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory) -> Path:
    """The run directory of ``finecap train demo/grpo_sr_cider`` (GDPO on SR + CIDEr-D with the KL) on a tiny world
    with a tiny random CLIP as encoder and retriever and a 1-layer ClipCap (seconds): what a GRPO user reports."""
    from finecap.app.cli import main
    from helpers.tiny_run import tiny_world_and_clip

    root = tmp_path_factory.mktemp("grpo")
    overrides, clip = tiny_world_and_clip(root, 24, 8, 8)
    run = root / "grpo_sr_cider"
    args = ["train", "demo/grpo_sr_cider", *overrides, *GRPO_TINY, f"retriever.checkpoint={clip}", f"run.dir={run}"]
    assert main(args) == 0
    return run


# ---------------------------------------------------------------------------------------------------------------------
# A real headless Chromium (Debian's chromium + chromium-driver; `make test` installs them when it can)
# ---------------------------------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1200,900"]  # fmt: skip


def _find(*names: str) -> str | None:
    import shutil

    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """A Selenium-driven headless Chromium with a fresh profile and browser console logging, one per test process
    (tests use :func:`browser`)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[test])")
    binary, driver_path = _find("chromium", "chromium-browser"), _find("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("no Chromium browser or chromedriver found; install them with `apt-get install chromium "
                    "chromium-driver` (`make test` does when it can)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    yield driver
    driver.quit()


@pytest.fixture
def browser(chromium):
    """The session's Chromium on an empty page, with no console message of an earlier test: the page an earlier test
    left (in whatever order the test processes run them) is unloaded and has finished before its messages are read
    out, so a test's console checks see only the pages it opened."""
    from selenium.webdriver.support.ui import WebDriverWait

    chromium.get("about:blank")
    WebDriverWait(chromium, 20).until(loaded)
    chromium.get_log("browser")  # read out: messages of the pages before
    return chromium
