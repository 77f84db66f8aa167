"""Keys from the environment (issue 22 item 4, boost side): every file boost writes, and what it prints, is grepped
for the key, including a failure whose server reply echoes it."""

import json
import logging
from pathlib import Path

import pytest

from finecap.app.boost import main as boost
from finecap.config import SECRET_KEYS, load
from helpers.chat_server import ChatServer, echo_first_caption
from helpers.tiny_world import make_tiny_world, world_items

SMALL = ("world.n_train=6", "world.n_val=1", "world.n_test=1")
ENV_KEY, CONFIG_KEY = "sk-env-5ecret-0123456789", "sk-config-5ecret-9876543210"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    return make_tiny_world(out, SMALL)


def _written(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize("how", ["env_default", "env_named", "config"])
def test_key_reaches_the_server_and_no_file(world, tmp_path, monkeypatch, capsys, caplog, how):
    caplog.set_level(logging.DEBUG, logger="finecap")  # every message finecap logs is searched too
    items = [*world_items(world, SMALL), "boost.mode=blend", "boost.llm_backend=openai", "boost.llm_model=m",
             "boost.max_failure_rate=0.5", "boost.few_shot=false"]  # fmt: skip
    key = ENV_KEY
    if how == "env_default":
        monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    elif how == "env_named":
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        monkeypatch.setenv("MY_LLM_KEY", ENV_KEY)
        items.append("boost.llm_api_key_env=MY_LLM_KEY")
    else:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        items.append(f"boost.llm_api_key={CONFIG_KEY}")  # deprecated, kept for old configurations
        key = CONFIG_KEY
    seen: list[str] = []

    def answer(payload, n):
        auth = server.requests[-1]["headers"]["Authorization"]
        seen.append(auth)
        if len(seen) == 1:
            return 400, {"error": f"invalid request from {auth}"}  # a server echoing the key in its error
        return echo_first_caption(payload, n)

    with ChatServer(answer) as server:
        summary = boost(load(None, [*items, f"boost.llm_base_url={server.url}"]), tmp_path / "out", progress=False)
    assert set(seen) == {f"Bearer {key}"} and summary["failed"] == 1
    printed = capsys.readouterr()
    files = _written(tmp_path / "out")
    assert {Path(p).name for p in files} == {"dataset.json", "boost.json", "cache.jsonl", "failures.jsonl",
                                             "scenes.jsonl", "dense.json", "world.json"}  # fmt: skip
    for path, data in files.items():
        assert key.encode() not in data and ENV_KEY.encode() not in data, path
    assert caplog.messages and key not in printed.out + printed.err + caplog.text
    failure = json.loads((tmp_path / "out" / "failures.jsonl").read_text())
    assert "invalid request from Bearer ***" in failure["error"]  # the echoed key is masked
    config = json.loads((tmp_path / "out" / "boost.json").read_text())["config"]
    assert config["llm_api_key"] == ("***" if how == "config" else "")
    assert config["llm_api_key_env"] == ("MY_LLM_KEY" if how == "env_named" else "OPENAI_API_KEY")


def test_secret_keys_name_the_key_fields():
    cfg = load(None, [])
    for dotted in SECRET_KEYS:
        section, name = dotted.split(".")
        assert getattr(getattr(cfg, section), name) == ""  # fields that exist, empty by default


def test_named_variable_that_is_unset_is_an_error(world, tmp_path, monkeypatch):
    monkeypatch.delenv("MY_MISSING_KEY", raising=False)
    cfg = load(None, [*world_items(world, SMALL), "boost.mode=blend", "boost.llm_backend=openai", "boost.llm_model=m",
                      "boost.llm_base_url=http://127.0.0.1:9/v1", "boost.llm_api_key_env=MY_MISSING_KEY"])  # fmt: skip
    with pytest.raises(ValueError, match="boost.llm_api_key_env=MY_MISSING_KEY: the environment variable"):
        boost(cfg, tmp_path / "out", progress=False)


@pytest.mark.parametrize("tail", ["\r", "\n", " ", "é"])
def test_a_key_no_header_can_carry_is_refused_before_any_request_and_never_shown(world, tmp_path, monkeypatch,
                                                                                 caplog, tail):  # fmt: skip
    # A key read from a .env file saved with CRLF ends in "\r": httpx refused the header on every request with
    # "Illegal header value b'Bearer <key>\\r'", the escaped key that the masking did not recognise, and the run
    # wrote it into failures.jsonl and boost.json (a space or "é" failed every request, or crashed, likewise).
    caplog.set_level(logging.DEBUG, logger="finecap")
    monkeypatch.setenv("MY_LLM_KEY", ENV_KEY + tail)
    requests: list[dict] = []
    with ChatServer() as server:
        cfg = load(None, [*world_items(world, SMALL), "boost.mode=blend", "boost.llm_backend=openai",
                          "boost.llm_model=m", f"boost.llm_base_url={server.url}", "boost.llm_api_key_env=MY_LLM_KEY",
                          "boost.max_failure_rate=1.0"])  # fmt: skip
        with pytest.raises(ValueError) as refused:
            boost(cfg, tmp_path / "out", progress=False)
        requests = server.requests
    message = str(refused.value)
    assert message.startswith("boost.llm_api_key_env: the API key holds a character an HTTP header cannot carry")
    assert f"at position {len(ENV_KEY) + 1} of {len(ENV_KEY) + 1}" in message
    assert not requests and ENV_KEY not in message + caplog.text
    assert not (tmp_path / "out").exists() or not any(
        ENV_KEY.encode() in d for d in _written(tmp_path / "out").values()
    )
