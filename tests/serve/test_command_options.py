"""``finecap serve-reward``'s options: every numeric option is checked for its range at the command line (a one-line
usage error, exit 2, before anything is loaded), and ``--token-file`` is read safely."""

from __future__ import annotations

import logging
import os
import re
import time

import pytest

from finecap.app.cli import main
from finecap.utils.token_file import read_token


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--port", "70000", "argument --port: must be from 0 to 65535, got 70000"),
        ("--port", "-1", "argument --port: must be from 0 to 65535"),
        ("--port", "80.5", "argument --port: expected a whole number, got '80.5'"),
        ("--batch-wait-ms", "inf", "argument --batch-wait-ms: must be from 0 to 60000, got inf"),
        ("--batch-wait-ms", "nan", "argument --batch-wait-ms: must be from 0 to 60000, got nan"),
        ("--batch-wait-ms", "-5", "argument --batch-wait-ms"),
        ("--batch-size", "0", "argument --batch-size: must be from 1 to 1000000"),
        ("--max-request-bytes", "0", "argument --max-request-bytes"),
        ("--max-captions", "1e99", "argument --max-captions: expected a whole number"),
        ("--max-caption-chars", "-3", "argument --max-caption-chars"),
        ("--header-timeout", "0", "argument --header-timeout"),
        ("--body-timeout", "1e300", "argument --body-timeout"),
        ("--max-connections", "0", "argument --max-connections"),
        ("--write-timeout", "0", "argument --write-timeout"),
        ("--log-every", "-inf", "argument --log-every"),
        ("--score-timeout", "0", "argument --score-timeout: must be from 0.001 to 86400, got 0"),
        ("--score-timeout", "inf", "argument --score-timeout"),
        ("--max-queued-bytes", "0", "argument --max-queued-bytes: must be from 1 to 1099511627776, got 0"),
        ("--max-queued-bytes", "1.5", "argument --max-queued-bytes: expected a whole number"),
    ],
)
def test_numeric_options_out_of_range_are_one_usage_line(option, value, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["serve-reward", "demo/sr_bagcurri", option, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing loaded, nothing written


def test_a_token_file_is_read_and_refused_safely(tmp_path):
    good = tmp_path / "token"
    good.write_text("s3cret-token-0123456789\nignored second line\n")
    os.chmod(good, 0o600)
    assert read_token(good) == "s3cret-token-0123456789"
    # every group or other bit is refused, and the message names those set (any was "readable by other users")
    shared = [
        (0o640, "readable by its group (mode -rw-r-----)"),
        (0o620, "writable by its group (mode -rw--w----)"),
        (0o604, "readable by other users (mode -rw----r--)"),
        (0o602, "writable by other users (mode -rw-----w-)"),
        (0o710, "executable by its group (mode -rwx--x---)"),
        (0o666, "readable and writable by its group and by other users (mode -rw-rw-rw-)"),
        (0o664, "readable and writable by its group, readable by other users (mode -rw-rw-r--)"),
    ]
    for mode, words in shared:
        os.chmod(good, mode)
        with pytest.raises(ValueError) as refused:
            read_token(good)
        assert str(refused.value) == f"--token-file {good}: {words}; chmod 600 {good}"
    # a non-ASCII token is refused: the server reads a header's other bytes as Latin-1, so it would never match
    for text, why in (("", "at least 16 printable"), ("short\n", "at least 16"), ("has a space in it 0123\n", "16"),
                      ("s3cret-tökén-0123456789\n", "printable ASCII")):  # fmt: skip
        bad = tmp_path / "bad"
        bad.write_text(text)
        os.chmod(bad, 0o600)
        with pytest.raises(ValueError, match=why):
            read_token(bad)
    with pytest.raises(ValueError, match="--token-file .*missing: No such file"):
        read_token(tmp_path / "missing")


def test_a_token_file_that_is_no_regular_file_or_another_users_is_refused_at_once(tmp_path):
    """A FIFO at --token-file (mode 600) blocked the command for ever, waiting for a writer; a file another user made
    (on a shared machine, in a shared folder, before the server's user: it holds a token that user knows) was
    accepted when its mode was 600 and the server could read it (root). Both are refused, at once."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    said: list[str] = []

    def read() -> None:
        try:
            read_token(fifo)
        except ValueError as e:
            said.append(str(e))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert said == [f"--token-file {fifo}: not a regular file: the token is read from a file of one line"], said
    big = tmp_path / "big"
    big.write_text("s3cret-token-0123456789\n" + "x" * 70_000)
    os.chmod(big, 0o600)
    with pytest.raises(ValueError, match="70,024 bytes, more than a token file's 65,536"):
        read_token(big)
    if os.getuid() != 0:
        pytest.skip("making a file owned by another user needs root")
    theirs = tmp_path / "theirs"
    theirs.write_text("s3cret-token-0123456789\n")
    os.chmod(theirs, 0o600)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ValueError, match=r"owned by another user \(uid 65534\)"):
        read_token(theirs)


def test_a_refused_token_file_is_one_error_line_before_anything_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789")
    os.chmod(token, 0o644)
    assert main(["serve-reward", "demo/sr_bagcurri", "--token-file", str(token)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("finecap: error: --token-file") and "s3cret" not in err and len(err.splitlines()) == 1


def test_the_address_is_given_back_when_setting_the_reward_up_fails(monkeypatch):
    # main() takes the address first; a failed set-up once left its socket open in a program that called main()
    from finecap.app import serve_reward
    from finecap.config import load
    from finecap.serve import app

    taken = []

    def bind(host, port):
        taken.append(real_bind(host, port))
        return taken[-1]

    def fails(*args, **kwargs):
        raise ValueError("the reward could not be set up")

    real_bind = app.bind
    monkeypatch.setattr(app, "bind", bind)
    monkeypatch.setattr(serve_reward, "build_service", fails)
    with pytest.raises(ValueError, match="could not be set up"):
        serve_reward.main(load(None, []), port=0)
    assert len(taken) == 1 and taken[0].fileno() == -1  # closed


def test_allow_host_is_repeatable_and_reaches_the_server(monkeypatch):
    import finecap.app.serve_reward as serve_reward

    seen = {}
    monkeypatch.setattr(serve_reward, "main", lambda cfg, **options: seen.update(options))
    assert main(["serve-reward", "demo/sr_bagcurri", "--allow-host", "reward", "--allow-host", "reward.local"]) == 0
    assert seen["allowed_hosts"] == ["reward", "reward.local"]
    main(["serve-reward", "demo/sr_bagcurri"])
    assert seen["allowed_hosts"] == []


def test_score_timeout_reaches_the_server_and_must_exceed_the_batch_wait_before_the_reward_loads(
    tmp_path, capsys, monkeypatch
):
    # a --score-timeout within --batch-wait-ms would answer every request 504: refused before the reward loads
    import finecap.app.serve_reward as serve_reward

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(serve_reward, "load_reward", lambda cfg: pytest.fail("the reward was loaded"))
    argv = ["serve-reward", "demo/sr_bagcurri", "--port", "0", "--batch-wait-ms", "5000", "--score-timeout", "5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "finecap: error: --score-timeout: must exceed --batch-wait-ms (5000 ms), got 5 s\n"
    seen = {}
    monkeypatch.setattr(serve_reward, "main", lambda cfg, **options: seen.update(options))
    assert main(["serve-reward", "demo/sr_bagcurri", "--score-timeout", "30.5"]) == 0
    assert seen["score_timeout"] == 30.5
    main(["serve-reward", "demo/sr_bagcurri"])
    assert seen["score_timeout"] == 120.0


def test_max_queued_bytes_reaches_the_server_and_must_hold_a_largest_request_before_the_reward_loads(
    tmp_path, capsys, monkeypatch
):
    # a --max-queued-bytes under --max-request-bytes would refuse every request of the largest size allowed
    import finecap.app.serve_reward as serve_reward
    from finecap.serve.service import MAX_QUEUED_BYTES

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(serve_reward, "load_reward", lambda cfg: pytest.fail("the reward was loaded"))
    argv = ["serve-reward", "demo/sr_bagcurri", "--port", "0", "--max-request-bytes", "2000", "--max-queued-bytes",
            "1000"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "finecap: error: --max-queued-bytes: must be at least --max-request-bytes (2,000), got 1,000\n"
    seen = {}
    monkeypatch.setattr(serve_reward, "main", lambda cfg, **options: seen.update(options))
    assert main(["serve-reward", "demo/sr_bagcurri", "--max-queued-bytes", "33554432"]) == 0
    assert seen["max_queued_bytes"] == 33_554_432
    main(["serve-reward", "demo/sr_bagcurri"])
    assert seen["max_queued_bytes"] == MAX_QUEUED_BYTES == 256 * 2**20


def test_the_servers_log_lines_say_when_in_utc(monkeypatch, capsys):
    # a server's lines were the message alone: a `> server.log` of a server left running for days could not tell when
    # anything happened; other commands' lines stay as they were
    import finecap.app.serve_reward

    def serve(cfg, **options):
        logging.getLogger("finecap.serve.service").info("reward server (words): 3 requests")
        logging.getLogger("finecap.serve.app").warning("reward server: 1 connection(s) closed at once")

    monkeypatch.setattr(finecap.app.serve_reward, "main", serve)
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # local time 5:30 ahead of UTC: a local stamp would show
    time.tzset()
    try:
        assert main(["serve-reward", "demo/sr_bagcurri", "--port", "0"]) == 0
    finally:
        monkeypatch.undo()
        time.tzset()
    lines = capsys.readouterr().err.splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert len(lines) == 2, lines
    assert re.fullmatch(rf"{stamp} reward server \(words\): 3 requests", lines[0]), lines
    assert re.fullmatch(rf"{stamp} warning: reward server: 1 connection\(s\) closed at once", lines[1]), lines
    import datetime

    when = datetime.datetime.strptime(lines[0][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 60  # UTC, not the local time


def test_uvicorns_own_lines_have_the_servers_format_and_time(capsys):
    # uvicorn's own logger ("uvicorn.error") printed through its own handler: 'WARNING:  Invalid HTTP request
    # received.' with no time, amid the server's stamped lines
    import socket

    from finecap.app.cli import configured_logging
    from finecap.rewards.cider import CiderReward
    from finecap.serve.service import ImageTable, RewardService
    from helpers.served import serving
    from helpers.waiting import until

    service = RewardService(CiderReward({1: ["a b"]}), ImageTable([1]), log_every=0, name="cider")
    said: list[str] = []

    def heard(words: str) -> bool:
        said.extend(capsys.readouterr().err.splitlines())
        return any(words in line for line in said)

    with configured_logging(timestamps=True), serving(service) as url:
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as garbage:
            garbage.sendall(b"NOT HTTP\r\n\r\n")
            assert garbage.recv(1024).startswith(b"HTTP/1.1 400")
        until(lambda: heard("Invalid HTTP request received."), "uvicorn's warning was not logged", timeout=10)
    heard("")
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    line = rf"{stamp} warning: reward server: 1 request\(s\) were no valid HTTP/1\.1 \(uvicorn: Invalid HTTP request "
    assert any(re.match(line, said_line) for said_line in said), said
    assert all(re.match(rf"{stamp} ", line) for line in said), said
