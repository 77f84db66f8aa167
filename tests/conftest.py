"""Fixtures of the tests under ``tests/``; the session-wide settings (one torch thread, the temporary finecap home
``finecap_home``) and the docstring examples' names are in the repository root's ``conftest.py``. Code the tests
share lives in ``tests/helpers/`` (``from helpers.shapes import ...``: pyproject.toml puts ``tests/`` on the path)."""

import signal
import socket
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def installed_finecap(tmp_path_factory) -> Path:
    """finecap's wheel installed into a fresh virtualenv (:func:`helpers.wheel.install_wheel`), once per test
    session for every xdist worker (:func:`helpers.once.once_per_session`): the virtualenv's folder."""
    from helpers.once import once_per_session
    from helpers.wheel import install_wheel, venv_in

    return venv_in(once_per_session(tmp_path_factory, "wheel", install_wheel))


@pytest.fixture(scope="session")
def quick_demo_run(tmp_path_factory, installed_finecap):
    """The one `finecap demo --quick` of the session, run by the installed wheel from an empty working directory
    with only ``--run-dir`` given (:class:`helpers.quick_demo.QuickDemo`), shared by every xdist worker: the tests
    of tests/app/test_demo.py, the browser tests, tests/repo/test_wheel.py. Its world and world encoder are in a
    finecap home of its own (tests/app/test_user_data.py checks that nothing else lands in the working directory);
    a test that runs more stages takes a copy (:func:`helpers.quick_demo.own_copy`)."""
    from helpers.once import once_per_session
    from helpers.quick_demo import quick_demo_in, run_quick_demo

    folder = once_per_session(tmp_path_factory, "quick-demo",
                              lambda out: run_quick_demo(out, installed_finecap))  # fmt: skip
    return quick_demo_in(folder, installed_finecap)


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> dict:
    """Coloured-shape images and a tiny random CLIP (:func:`helpers.shapes.make_shapes`), for the captioner that
    tests/app/test_caption_images.py and tests/api/test_api.py share."""
    from helpers.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"))


@pytest.fixture(scope="session")
def run(shapes):
    """A tiny ClipCap trained once per session on ``shapes`` (:func:`helpers.shapes.train_shapes_run`): its
    training takes seconds, so the modules using it share one."""
    from helpers.shapes import train_shapes_run

    return train_shapes_run(shapes)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A tiny world, a tiny random CLIP and the overrides of a 1-layer ClipCap that trains in a second
    (:func:`helpers.tiny_run.make_tiny`), once per test module; modules with a tiny setup of their own define their
    own ``tiny``."""
    from helpers.tiny_run import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def secret_run(tiny) -> dict:
    """A 2-step training run of ``tiny`` with API keys in its recipe, an override and the environment
    (:func:`helpers.tiny_run.train_with_secrets`), once per test module."""
    from helpers.tiny_run import train_with_secrets

    return train_with_secrets(tiny)


@pytest.fixture
def group():
    """A 1-process gloo process group on a free loopback port, for sharding code run in one process (FSDP2's
    ``fully_shard`` needs a group); destroyed afterwards."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    if dist.is_initialized():  # a test may have ended it (a command leaves the group it ran in)
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> dict:
    """A tiny world served as ``finecap serve-reward`` serves it: the NDLB mixture (retrieval 1.0 + cider 0.5, a tiny
    random CLIP as the retriever) and CIDEr-D alone, with the identity tests' 1,000 captions
    (:func:`helpers.served.make_served`), once per session."""
    from helpers.served import make_served

    return make_served(tmp_path_factory.mktemp("served"))


@pytest.fixture
def hangup_default():
    """SIGHUP at its default in this process, so in the processes a test starts too, for the test: the hang-up tests'
    subject is what a hang-up does to a process that has not ignored it, and a suite run under ``nohup`` (which
    ignores SIGHUP in it and its children) would otherwise test nothing of it and fail. Put back after."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is None:  # no hang-ups on this platform: the tests skip themselves
        yield
        return
    before = signal.getsignal(hup)
    signal.signal(hup, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(hup, before)
