"""The demo's bags files (the report's ``bags_test.json``, the scene-family world's ``families10/bags_test.json``, the
transfer and VCB stages' bags) are built once and read back only while what built them is what would build them now
(:func:`finecap.app.bags.reuse_bags`): another world, retriever or ``eval.bag_sizes`` builds them again; a bags file of
the user's is refused, never replaced. Tiny worlds of 6 test images and tiny random CLIPs as the retriever: no
training, no demo run."""

import json
from pathlib import Path

import pytest

from finecap.app import demo as demo_mod
from finecap.app import demo_families
from finecap.app.bags import reuse_bags
from finecap.app.demo import demo_runner, load_demo_config
from finecap.config import WorldConfig
from finecap.models.presets import save_tiny_clip
from finecap.outputs import OutputRefused, write_output_json
from finecap.stages import StageRunner
from finecap.train.fingerprint import source_fingerprint
from finecap.world.make import make_world

SIZES = {"n_train": 2, "n_val": 2, "n_test": 6, "image_size": 32}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """Two tiny worlds (seeds 0 and 1) and two tiny random CLIPs (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("bags_inputs")
    worlds = {}
    for seed in (0, 1):
        make_world(WorldConfig(**SIZES, seed=seed), root / f"world{seed}", progress=False)
        worlds[seed] = [f"world.out={root / f'world{seed}'}", f"world.seed={seed}",
                        *(f"world.{k}={v}" for k, v in SIZES.items())]  # fmt: skip
    clips = {seed: save_tiny_clip(root / f"clip{seed}", image_size=32, patch_size=16, seed=seed) for seed in (0, 1)}
    return {"worlds": worlds, "clips": clips}


def _demo(tmp_path: Path, inputs: dict, *, world: int = 0, clip: int = 0, sizes: str = "[2]",
          more: tuple[str, ...] = ()) -> StageRunner:  # fmt: skip
    items = [*inputs["worlds"][world], f"retriever.checkpoint={inputs['clips'][clip]}", f"eval.bag_sizes={sizes}",
             f"run.cache_dir={tmp_path / 'cache'}", *more]  # fmt: skip
    return demo_runner(load_demo_config(None, items, True), items, True, tmp_path / "run")


def _recorded(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_reports_bags_are_built_again_when_their_world_retriever_or_sizes_change(tmp_path, inputs):
    demo = _demo(tmp_path, inputs)
    path = demo.run_dir / "bags_test.json"
    assert set(demo_mod.test_bags(demo)) == {2}
    first = path.read_bytes()
    recorded = _recorded(path)
    assert recorded["retriever_fingerprint"]["sha256"] == source_fingerprint(inputs["clips"][0])["sha256"]
    stamp = path.stat().st_mtime_ns

    demo_mod.test_bags(_demo(tmp_path, inputs))  # the same inputs: read back, not built again
    assert path.read_bytes() == first and path.stat().st_mtime_ns == stamp

    demo_mod.test_bags(_demo(tmp_path, inputs, clip=1))  # another retriever
    assert _recorded(path)["retriever_fingerprint"]["sha256"] == source_fingerprint(inputs["clips"][1])["sha256"]

    assert set(demo_mod.test_bags(_demo(tmp_path, inputs, clip=1, sizes="[2,3]"))) == {2, 3}  # eval.bag_sizes
    assert _recorded(path)["sizes"] == [2, 3]

    other = _demo(tmp_path, inputs, world=1, clip=1, sizes="[2,3]")  # another world (world.seed)
    demo_mod.test_bags(other)
    now = _recorded(path)["fingerprint"]
    assert now["path"] == str(Path(other.cfg.world.out).resolve() / "dataset.json")
    assert now["world_key"] != recorded["fingerprint"]["world_key"]


@pytest.mark.parametrize(("setting", "before", "after"), [("retriever.long_text", "truncate", "chunks"),
                                                           ("data.jpeg_draft", True, False),
                                                           ("retriever.batch_size_eval", 256, 2)])  # fmt: skip
def test_the_bags_are_built_again_when_a_setting_of_their_embeddings_changes(tmp_path, inputs, caplog, setting,
                                                                               before, after):  # fmt: skip
    """``retriever.long_text`` (a caption longer than the text window cut or pooled over windows),
    ``data.jpeg_draft`` (a JPEG draft-decoded or decoded whole) and ``retriever.batch_size_eval`` (other batch shapes
    round otherwise: the embeddings differ in their last bits) change the embeddings the bags are built from: the
    file records them, and bags built under another value are built again (they were read back)."""
    key = setting.split(".")[1]
    path = tmp_path / "run" / "bags_test.json"
    demo_mod.test_bags(_demo(tmp_path, inputs))
    assert _recorded(path)[key] == before
    stamp = path.stat().st_mtime_ns
    changed = _demo(tmp_path, inputs, more=(f"{setting}={str(after).lower()}",))
    with caplog.at_level("INFO", logger="finecap.app.bags"):
        assert set(demo_mod.test_bags(changed)) == {2}
    assert _recorded(path)[key] == after and path.stat().st_mtime_ns != stamp
    assert f"building the bags again ({key}: {before!r} -> {after!r})" in caplog.text


def test_bags_built_under_another_image_budget_are_read_back(tmp_path, inputs):
    """The image budget (``data.max_image_pixels``, ``data.max_aspect_ratio``) refuses an image (the build fails) and
    changes no pixel of one it admits: bags built under another budget are the bags it builds, read back as they are.
    """
    path = tmp_path / "run" / "bags_test.json"
    demo_mod.test_bags(_demo(tmp_path, inputs))
    first, stamp = path.read_bytes(), path.stat().st_mtime_ns
    other = _demo(tmp_path, inputs, more=("data.max_image_pixels=4096", "data.max_aspect_ratio=1.5"))  # 32 x 32 fit
    assert set(demo_mod.test_bags(other)) == {2}
    assert path.read_bytes() == first and path.stat().st_mtime_ns == stamp


def test_bags_recorded_before_their_retriever_was_are_built_again(tmp_path, inputs):
    """A bags file of an earlier finecap (no ``retriever_fingerprint``): its retriever is unknown, so it is built
    again, being finecap's."""
    demo = _demo(tmp_path, inputs)
    path = demo.run_dir / "bags_test.json"
    demo_mod.test_bags(demo)
    old = _recorded(path)
    del old["retriever_fingerprint"]
    write_output_json(path, old, "bags")  # as finecap wrote it then
    demo_mod.test_bags(demo)
    assert _recorded(path)["retriever_fingerprint"]["sha256"] == source_fingerprint(inputs["clips"][0])["sha256"]


@pytest.mark.parametrize("force", [False, True])
def test_a_users_bags_file_built_otherwise_is_refused_never_replaced(tmp_path, inputs, force):
    demo = _demo(tmp_path, inputs, more=(f"demo.force={str(force).lower()}",))
    path = demo.run_dir / "bags_test.json"
    path.parent.mkdir(parents=True)
    mine = json.dumps({"bags": {"2": [{"images": [0, 1]}]}})  # the user's own bags, recording nothing
    path.write_text(mine)
    with pytest.raises(OutputRefused) as e:
        demo_mod.test_bags(demo)
    message = str(e.value)
    assert message.startswith(f"{path}: bags finecap did not make")
    assert ("made again on request" if force else "retriever_fingerprint: not recorded") in message
    assert "move the file away" in message and "another run directory" in message
    assert path.read_text() == mine


def test_a_users_copy_of_bags_built_from_the_same_inputs_is_read(tmp_path, inputs):
    """What decides reuse is what built the bags, not who wrote the file: bags the user built with `finecap bags
    build` on the same inputs and saved again (another indentation) are read as they are."""
    demo = _demo(tmp_path, inputs)
    path = demo.run_dir / "bags_test.json"
    demo_mod.test_bags(demo)
    mine = json.dumps(_recorded(path))  # the same record, other bytes: not finecap's file any more
    path.write_text(mine)
    assert set(demo_mod.test_bags(demo)) == {2}
    assert path.read_text() == mine


def test_the_family_worlds_bags_are_built_again_on_another_world(tmp_path, inputs, monkeypatch):
    """``families<size>/bags_test.json``: the report scores the bag columns on them; the report refuses finished
    stages trained on another world first, but with none finished (the human row alone) nothing did."""
    monkeypatch.setattr("finecap.metrics.families.FAMILY_SIZE", 3)  # 6 test images: 2 families
    first = demo_families.family_world(_demo(tmp_path, inputs))
    path = tmp_path / "run" / "families3" / "bags_test.json"
    assert _recorded(path)["fingerprint"]["path"] == str(first.path.resolve() / "dataset.json")
    second = demo_families.family_world(_demo(tmp_path, inputs, world=1))
    assert second.path != first.path
    assert _recorded(path)["fingerprint"]["path"] == str(second.path.resolve() / "dataset.json")


def test_bags_built_again_hash_their_retriever_once(tmp_path, inputs, monkeypatch):
    """Building the bags again, reuse_bags computed what builds them (hashing the retriever's weights) to compare, and
    main computed it again to record it: once is enough."""
    import finecap.app.bags

    demo = _demo(tmp_path, inputs)
    path = demo.run_dir / "bags_test.json"
    demo_mod.test_bags(demo)
    changed = _demo(tmp_path, inputs, clip=1)  # another retriever: built again
    hashed = []
    real = finecap.app.bags.bags_retriever_fingerprint
    monkeypatch.setattr(finecap.app.bags, "bags_retriever_fingerprint", lambda cfg: hashed.append(cfg) or real(cfg))
    reuse_bags(changed.cfg, out=path)
    assert len(hashed) == 1
    assert _recorded(path)["retriever_fingerprint"]["sha256"] == source_fingerprint(inputs["clips"][1])["sha256"]


def test_reuse_bags_builds_what_is_missing_in_the_configured_sizes(tmp_path, inputs):
    demo = _demo(tmp_path, inputs, sizes="[3,2]")
    out = reuse_bags(demo.cfg, out=tmp_path / "elsewhere" / "bags.json")
    assert _recorded(out)["sizes"] == [2, 3] and _recorded(out)["split"] == "test"
