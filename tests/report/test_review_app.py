"""`finecap bags review` app through Flask's test client and a real server on 127.0.0.1: pages, decisions saved as
made (and none lost to simultaneous clicks), checks at start, and a server that serves no one else (Host, Origin,
CSRF token, access token beyond loopback, images only)."""

import html
import itertools
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from finecap.app.review import create_app, default_out, resolve_under
from finecap.data.bags_file import read_bags
from finecap.data.curation import decisions_path
from finecap.data.records import DataError
from finecap.outputs import OutputRefused


@pytest.fixture
def app_and_paths(fabricated_run, tiny_world, tmp_path):
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    app = create_app(bags, tiny_world / "images")
    return app, bags, tiny_world


def form_token(client, url: str) -> str:
    page = client.get(url).get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def post(client, url: str, decision: str, **headers):
    return client.post(url, data={"decision": decision, "csrf_token": form_token(client, url)}, headers=headers)


def test_pages_show_images_and_captions_and_save_decisions(app_and_paths):
    app, bags, world = app_and_paths
    client = app.test_client()
    first = client.get("/")
    assert first.status_code == 302 and first.headers["Location"].endswith("/bag/3/0")
    page = client.get("/bag/3/0").get_data(as_text=True)
    ids = json.loads(bags.read_text())["bags"]["3"][0]["images"]
    dataset = json.loads((world / "dataset.json").read_text())
    caption = next(im["sentences"][0]["raw"] for im in dataset["images"] if im["imgid"] == ids[0])
    assert caption in page and 'id="status" class="status pending"' in page
    urls = [f"/image/{im['filepath']}/{im['filename']}" for im in dataset["images"] if im["imgid"] in ids]
    assert all(u in page for u in urls)
    image = client.get(urls[0])
    assert image.status_code == 200 and image.data[:8] == b"\x89PNG\r\n\x1a\n" and image.mimetype == "image/png"

    after = post(client, "/bag/3/0", "accept")
    assert after.status_code == 303 and after.headers["Location"].endswith("/bag/3/1")  # next undecided bag
    post(client, "/bag/3/1", "reject")
    out = default_out(bags)
    assert out.name == "bags.curated.json" and read_bags(out)[3] == [ids]  # saved on the click, no shutdown needed
    assert 'class="status accept"' in client.get("/bag/3/0").get_data(as_text=True)

    # A new app on the same files (server restarted, tab reopened) resumes: first undecided bag, decisions kept.
    again = create_app(bags, world / "images").test_client()
    assert again.get("/").headers["Location"].endswith("/bag/5/0")
    assert 'class="status reject"' in again.get("/bag/3/1").get_data(as_text=True)
    bad = post(again, "/bag/3/1", "maybe")
    assert bad.status_code == 400 and "decision must be one of accept, reject" in bad.get_data(as_text=True)
    missing = again.get("/bag/7/0")
    assert missing.status_code == 404 and "no bag '7/0'" in missing.get_data(as_text=True)
    # A form from before the restart carries the old server's token: refused with a message, nothing saved.
    stale = again.post("/bag/5/0", data={"decision": "accept", "csrf_token": form_token(client, "/bag/5/0")})
    assert stale.status_code == 400 and "reload the page" in stale.get_data(as_text=True)
    assert "5/0" not in again.application.config["curation"].decisions


def test_a_link_planted_at_the_lock_file_is_a_named_refusal_not_a_500(app_and_paths, tmp_path):
    # a link at the decisions' lock file (.bags.curated.json.lock) made filelock fail with a bare OSError: a plain 500
    from finecap.data.curation import lock_path

    app, bags, _ = app_and_paths
    client = app.test_client()
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine")
    lock = lock_path(default_out(bags))
    lock.unlink()  # the lock file the start made, replaced by a link
    lock.symlink_to(theirs)
    refused = post(client, "/bag/3/0", "accept")
    text = refused.get_data(as_text=True)
    assert refused.status_code == 409 and text.startswith(f"409 Conflict: {lock}: is a symbolic link (to {theirs})")
    assert "remove the link" in text
    assert theirs.read_text() == "mine" and app.config["curation"].decisions == {}
    lock.unlink()  # the link removed: the same click is saved
    assert post(client, "/bag/3/0", "accept").status_code == 303 and app.config["curation"].decisions == {
        "3/0": "accept"
    }


def test_a_bag_is_named_only_by_its_own_key(app_and_paths):
    # '/bag/3/<superscript two>' was a 500 (int() of a str.isdigit() index), '/bag/3/00' and '/bag/3/<Arabic-Indic
    # zero>' a second page of bag 3/0 whose buttons answered a bare 404 '3/00'
    app, _, _ = app_and_paths
    client = app.test_client()
    token = form_token(client, "/bag/3/0")
    for key in ("3/\u00b2", "3/00", "3/\u0660", "03/0"):
        url = "/bag/" + urllib.parse.quote(key)
        for response in (client.get(url), client.post(url, data={"decision": "accept", "csrf_token": token})):
            text = response.get_data(as_text=True)
            assert response.status_code == 404 and "no bag" in text and "keys look like '3/0'" in text, key
    assert app.config["curation"].decisions == {}


def test_an_empty_bags_file_says_so(tiny_world, tmp_path):
    bags = tmp_path / "empty.json"
    bags.write_text('{"bags": {"3": []}}')
    response = create_app(bags, tiny_world / "images").test_client().get("/")
    assert response.status_code == 404 and "holds no bags" in response.get_data(as_text=True)


def test_only_image_files_of_the_bags_are_served(app_and_paths, tmp_path):
    app, bags, world = app_and_paths
    secret = world / "dataset.json"  # exists, one level above the image root
    root = world / "images"
    client = app.test_client()
    bag_ids = {i for b in json.loads(bags.read_text())["bags"].values() for e in b for i in e["images"]}
    dataset = json.loads(secret.read_text())
    other = next(im for im in dataset["images"] if im["imgid"] not in bag_ids)  # an image, but of no bag
    (root / "test" / "notes.txt").write_text("not an image")
    (root / "test" / "fake.png").write_text("not a png either")
    try:
        for url in ["/image/../dataset.json", "/image/..%2Fdataset.json", "/image/%2E%2E/dataset.json",
                    f"/image/{secret}", f"/image/%2F{str(secret).lstrip('/')}", "/image//etc/passwd",
                    "/image/%2Fetc%2Fpasswd", "/image/..\\dataset.json", "/image/x/../../dataset.json",
                    "/image/%00", "/image/test/%00.png", "/image/" + "a" * 5000 + ".png", "/image/test/notes.txt",
                    "/image/test/fake.png", f"/image/{other['filepath']}/{other['filename']}"]:  # fmt: skip
            response = client.get(url, follow_redirects=True)  # werkzeug merges slashes by redirecting
            assert response.status_code == 404, url
            assert response.get_data(as_text=True).startswith("404 Not Found: not an image of the bags"), url
            assert b'"images"' not in response.data, url
    finally:
        (root / "test" / "notes.txt").unlink()
        (root / "test" / "fake.png").unlink()
    assert resolve_under(root, "../dataset.json") is None
    assert resolve_under(root, str(secret)) is None
    assert resolve_under(root, "C:/x.png") is None
    assert resolve_under(root, "test/\x00.png") is None
    link = root / "escape.json"
    os.symlink(secret, link)  # a symlink inside the root that leads outside it
    try:
        assert resolve_under(root, "escape.json") is None
        assert client.get("/image/escape.json").status_code == 404
    finally:
        link.unlink()
    name = sorted(p.name for p in (root / "test").iterdir())[0]
    assert resolve_under(root, f"test/{name}") == (root / "test" / name).resolve()
    assert resolve_under(root, "test") is None  # a folder, not a file
    page = client.get("/bag/3/0")
    assert page.headers["X-Content-Type-Options"] == "nosniff" and page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]


def test_cross_site_requests_and_foreign_hosts_are_refused(app_and_paths):
    app, bags, _ = app_and_paths
    client = app.test_client()
    token = form_token(client, "/bag/3/0")
    form = {"decision": "accept", "csrf_token": token}
    refused = {
        "Origin": {"Origin": "http://evil.example"},
        "Origin null": {"Origin": "null"},
        "Origin other port": {"Origin": "http://localhost:9999"},
        "Referer": {"Referer": "http://evil.example/page"},
        "Sec-Fetch-Site": {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
        "same-site": {"Sec-Fetch-Site": "same-site"},
    }
    for what, headers in refused.items():
        response = client.post("/bag/3/0", data=form, headers=headers)
        assert response.status_code == 403, what
        assert "refused" in response.get_data(as_text=True), what
    for what, data in {
        "no form token": {"decision": "accept"},
        "wrong form token": {**form, "csrf_token": "x"},
    }.items():
        response = client.post("/bag/3/0", data=data, headers={"Origin": "http://localhost"})
        assert response.status_code == 400 and "form token" in response.get_data(as_text=True), what
    assert app.config["curation"].decisions == {}  # nothing above was saved
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example.
    for method in (client.get, client.post):
        response = method("/bag/3/0", headers={"Host": "evil.example:8765"}, data=form)
        assert response.status_code == 400 and "DNS-rebinding" in response.get_data(as_text=True)
    # A cross-site subresource (an <img> on another site) is refused; a link followed from elsewhere is not.
    assert client.get("/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}).status_code == 403
    assert client.get("/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}).status_code == 302
    # The page's own requests pass: same origin, the loopback names with a port.
    for host in ("localhost:8765", "127.0.0.1:8765", "[::1]:8765"):
        ok = client.post("/bag/3/0", data=form, headers={"Host": host, "Origin": f"http://{host}",
                                                         "Sec-Fetch-Site": "same-origin"})  # fmt: skip
        assert ok.status_code == 303, host
    assert app.config["curation"].decisions == {"3/0": "accept"}
    # a body beyond a decision's form is refused before it is read (it was spooled to a temporary file first)
    huge = client.post("/bag/3/0", data={**form, "pad": "x" * (1 << 20)}, headers={"Origin": "http://localhost"})
    assert huge.status_code == 413 and app.config["curation"].decisions == {"3/0": "accept"}


def test_beyond_loopback_a_token_is_required(fabricated_run, tiny_world, tmp_path):
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    with pytest.raises(ValueError, match="--host 0.0.0.0: serving beyond this machine needs an access token"):
        create_app(bags, tiny_world / "images", host="0.0.0.0")
    app = create_app(bags, tiny_world / "images", host="0.0.0.0", token="s3cret-token")
    client = app.test_client()
    lan = {"Host": "192.168.1.7:8765"}  # bound to every address: the machine's IP literals are fine
    for url in ("/", "/bag/3/0", "/?token=wrong"):
        response = client.get(url, headers=lan)
        assert response.status_code == 401 and "access token" in response.get_data(as_text=True), url
    assert client.get("/", headers={"Host": "evil.example:8765"}).status_code == 400  # still no rebinding
    entry = client.get("/bag/3/0?token=s3cret-token", headers=lan)
    assert entry.status_code == 302 and entry.headers["Location"] == "/bag/3/0"  # token out of the address bar
    cookie = entry.headers["Set-Cookie"]
    assert "finecap_review_8765=s3cret-token" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert client.get("/bag/3/0", headers=lan).status_code == 200  # the cookie from now on
    # the path is redirected to as it was sent: a CR/LF in it (decoded by werkzeug) was a 500, never a header
    odd = client.get("/bag/3%0D%0ASet-Cookie:%20x=1/0?token=s3cret-token", headers=lan)
    assert odd.status_code == 302 and odd.headers["Location"] == "/bag/3%0D%0ASet-Cookie%3A%20x%3D1/0"
    assert client.get(odd.headers["Location"], headers=lan).status_code == 404
    page = client.get("/bag/3/0", headers=lan).get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    saved = client.post("/bag/3/0", data={"decision": "reject", "csrf_token": token}, headers=lan)
    assert saved.status_code == 303 and app.config["curation"].decisions == {"3/0": "reject"}
    assert "s3cret-token" not in default_out(bags).read_text() + decisions_path(default_out(bags)).read_text()


def _served_until_interrupted(monkeypatch) -> list:
    """``review.main``'s server replaced by one that stops at once (as Ctrl-C does): the list the apps it was given
    are appended to."""
    from finecap.app import review

    class Server:
        server_port = 8765

        def serve_forever(self):
            raise KeyboardInterrupt

        def server_close(self):
            pass

    bound: list = []
    monkeypatch.setattr(review, "ReviewServer", lambda host, port, app, **kw: bound.append(app) or Server())
    return bound


def test_main_warns_beyond_loopback_and_requires_a_generated_token_everywhere(
    fabricated_run, tiny_world, tmp_path, monkeypatch, capsys, caplog
):
    from finecap.app import review

    bound = _served_until_interrupted(monkeypatch)
    monkeypatch.delenv(review.TOKEN_ENV, raising=False)
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    review.main(bags, tiny_world / "images", host="0.0.0.0", port=0)
    captured = capsys.readouterr()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("--host 0.0.0.0 serves the review page beyond this machine") for m in warned)
    token = re.search(r"\?token=(\S+)", captured.out).group(1)
    assert len(token) >= 24
    client = bound[0].test_client()
    assert client.get("/", headers={"Host": "127.0.0.1"}).status_code == 401
    assert client.get(f"/?token={token}", headers={"Host": "127.0.0.1"}).status_code == 302
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or token not in path.read_text(errors="replace"), path
    caplog.clear()
    review.main(bags, tiny_world / "images", port=0)  # loopback: no warning, but a token all the same
    captured = capsys.readouterr()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert captured.err == "" and "open http://127.0.0.1:8765/?token=" in captured.out
    # another user of the machine reaches 127.0.0.1 too: without the printed token, nothing is served
    local = re.search(r"\?token=(\S+)", captured.out).group(1)
    assert len(local) >= 24 and local != token
    client = bound[1].test_client()
    assert client.get("/", headers={"Host": "127.0.0.1"}).status_code == 401
    assert client.get(f"/?token={local}", headers={"Host": "127.0.0.1"}).status_code == 302


def test_a_token_with_url_characters_is_read_whole_and_the_request_log_never_holds_it(fabricated_run, tiny_world,
                                                                                      tmp_path, monkeypatch, capsys,
                                                                                      caplog):  # fmt: skip
    # werkzeug logged every request line in full, '?token=...' included: a `nohup` or job scheduler's log of the
    # server held the access token. A token holding '&', '#' or a space, percent-encoded in the URL, is read whole
    # (the browser's cookie redirect, then the first bag). A given token is not printed (the test
    # test_a_token_the_user_gave_is_never_printed_...): the URL is the printed address with it added.
    from finecap.app import review

    real, servers = review.ReviewServer, []

    def on_a_free_port(host, port, app, **kw):
        servers.append(real(host, 0, app, **kw))
        return servers[-1]

    monkeypatch.setattr(review, "ReviewServer", on_a_free_port)
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    token = "s3cret-token & #more words+"
    caplog.set_level(logging.INFO, logger="werkzeug")
    thread = threading.Thread(target=review.main, args=(bags, tiny_world / "images"), kwargs={"token": token})
    thread.start()
    try:
        while not servers and thread.is_alive():
            thread.join(0.05)
        url = None
        while url is None and thread.is_alive():  # printed once the curated file is rebuilt
            url = re.search(r"open (\S+)", capsys.readouterr().out)
            thread.join(0.05) if url is None else None
        url = url.group(1).removesuffix("?token=...") + "?" + urllib.parse.urlencode({"token": token})
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(url, timeout=30) as response:  # the cookie's redirect, then the first bag
            assert response.status == 200 and response.url.endswith("/bag/3/0")
    finally:
        servers[0].shutdown()
        thread.join(30)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "werkzeug")
    assert "GET /?(query not logged) HTTP/1.1" in logged  # the request was logged, its query was not
    assert "s3cret" not in logged and "token=" not in logged


def test_a_chunked_body_is_refused_not_cut_at_the_form_limit(app_and_paths):
    # A body sent chunked (no Content-Length) escaped the 413: werkzeug cut it at MAX_FORM_BYTES and parsed what it
    # had read, so a 200 KB body carrying the form's fields first was taken as a decision (303, saved).
    import http.client

    from werkzeug.serving import make_server

    app, _, _ = app_and_paths
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    body = (
        urllib.parse.urlencode({"decision": "accept", "csrf_token": app.config["csrf_token"]})
        + "&pad="
        + "x" * (200 << 10)
    )
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        conn.request("POST", "/bag/3/0", body=iter([body.encode()]), encode_chunked=True,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        response = conn.getresponse()
        status, text = response.status, response.read().decode()
        conn.close()
    finally:
        server.shutdown()
        thread.join()
    assert status == 411 and "Content-Length" in text
    assert app.config["curation"].decisions == {}


def _serving(server) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def _until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


HALF_A_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # the headers never end


def _answer(port: int, request: bytes, seconds: float = 30.0) -> bytes:
    """What the server sends back to ``request`` until it closes the connection (or ``seconds`` pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        sock.sendall(request)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if b"\r\n\r\n" in received:  # the answer's head: enough to tell
                    break
        except ConnectionResetError:
            pass
        return received


def test_a_client_sending_half_a_request_is_dropped_after_the_read_timeout(app_and_paths):
    # werkzeug's server read a request for ever: a local client sending half of one (slowloris) held its thread until
    # the server stopped. ReviewServer closes a connection silent for read_timeout seconds (READ_TIMEOUT in main).
    from finecap.app.review import READ_TIMEOUT, ReviewServer

    assert 0 < READ_TIMEOUT <= 60
    app, _, _ = app_and_paths
    server = ReviewServer("127.0.0.1", 0, app, read_timeout=0.5)
    thread = _serving(server)
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=30) as sock:
            sock.sendall(HALF_A_REQUEST)
            started = time.monotonic()
            try:
                closed = sock.recv(1024) == b""  # the server closes it, answering nothing
            except ConnectionResetError:
                closed = True
            waited = time.monotonic() - started
        assert closed and waited < 20, waited  # not the client's own 30 s timeout (socket.timeout)
        assert _until(lambda: server.connections == 0)  # its thread is free again
        assert _answer(server.server_port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 302")
    finally:
        server.shutdown()
        thread.join(30)


def test_connections_beyond_the_cap_are_closed_unanswered_until_a_thread_is_free(app_and_paths, caplog):
    # werkzeug started a thread for every connection, without a bound: clients holding half requests took threads
    # without end. ReviewServer serves max_connections at once (MAX_CONNECTIONS in main) and closes one more.
    from finecap.app.review import MAX_CONNECTIONS, ReviewServer

    assert 6 <= MAX_CONNECTIONS <= 256  # a browser opens about six connections to one server
    app, _, _ = app_and_paths
    server = ReviewServer("127.0.0.1", 0, app, read_timeout=60, max_connections=2)
    thread = _serving(server)
    full = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    slow = [socket.create_connection(("127.0.0.1", server.server_port), timeout=30) for _ in range(2)]
    try:
        for sock in slow:
            sock.sendall(HALF_A_REQUEST)
        assert _until(lambda: server.connections == 2)
        with caplog.at_level(logging.WARNING, logger="finecap.app.review"):
            assert _answer(server.server_port, full) == b""  # closed unanswered: both threads are held
        assert "2 connections open, the most it serves at once" in caplog.text
        slow.pop().close()  # one slow client leaves: its thread ends, and the next connection is served
        assert _until(lambda: server.connections == 1)
        assert _answer(server.server_port, full).startswith(b"HTTP/1.1 302")
    finally:
        for sock in slow:
            sock.close()
        server.shutdown()
        thread.join(30)


def test_simultaneous_clicks_lose_no_acknowledged_decision(tiny_world, tmp_path):
    """100 pairs of POSTs sent at the same moment to a real threaded server: every decision that got its redirect is
    on disk (issue 22: 9 of 100 pairs lost one before)."""
    from werkzeug.serving import make_server

    ids = json.loads((tiny_world / "dataset.json").read_text())["images"]
    test_ids = [im["imgid"] for im in ids if im["split"] == "test"]
    combos = [list(c) for c in itertools.combinations(test_ids, 3)][:200]
    bags = tmp_path / "bags.json"
    bags.write_text(
        json.dumps({"data": str(tiny_world / "dataset.json"), "bags": {"3": [{"images": c} for c in combos]}})
    )
    app = create_app(bags, tiny_world / "images")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    token = app.config["csrf_token"]

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    acknowledged: dict[str, str] = {}

    def click(key: str, decision: str, barrier: threading.Barrier) -> None:
        body = urllib.parse.urlencode({"decision": decision, "csrf_token": token}).encode()
        req = urllib.request.Request(f"{url}/bag/{key}", data=body, headers={"Origin": url})
        barrier.wait()
        try:
            opener.open(req, timeout=30)
        except urllib.error.HTTPError as e:
            if e.code == 303:
                acknowledged[key] = decision

    try:
        for k in range(100):
            barrier = threading.Barrier(2)
            pair = [threading.Thread(target=click, args=(f"3/{2 * k}", "accept", barrier)),
                    threading.Thread(target=click, args=(f"3/{2 * k + 1}", "reject", barrier))]  # fmt: skip
            for t in pair:
                t.start()
            for t in pair:
                t.join()
    finally:
        server.shutdown()
        thread.join()
    assert len(acknowledged) == 200
    saved = json.loads(decisions_path(default_out(bags)).read_text())["decisions"]
    on_disk = {json.dumps(sorted(e["images"])): e["decision"] for e in saved}
    assert on_disk == {json.dumps(sorted(combos[int(k.split("/")[1])])): v for k, v in acknowledged.items()}
    assert read_bags(default_out(bags), disjoint=False)[3] == [combos[i] for i in range(0, 200, 2)]


def test_start_checks_the_image_folder_and_the_data(fabricated_run, tiny_world, tmp_path, capsys):
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    wrong = tmp_path / "photos"
    wrong.mkdir()
    with pytest.raises(FileNotFoundError, match=rf"--images {wrong}: none of the 11 bag images is there as an image "
                                                rf"file \(expected e.g. {wrong}/test/"):  # fmt: skip
        create_app(bags, wrong)
    from finecap.app.cli import main

    assert main(["bags", "review", str(bags), "--images", str(wrong), "--port", "0"]) == 2
    assert f"--images {wrong}: none of the 11 bag images" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bags.json", "photos"]  # a failed start wrote nothing
    import socket

    with socket.socket() as taken:  # a port in use: the server cannot bind, and nothing is written either
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["bags", "review", str(bags), "--images", str(tiny_world / "images"), "--port", port]) == 2
    assert "in use" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bags.json", "photos"]
    # Bags built on another data set, and bags that do not say which data set they come from.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"data": str(tiny_world / "dataset.json"), "bags": {"2": [["x1", "x2"]]}}))
    with pytest.raises(DataError, match="none of the 2 images of the bags in .*other.json is in this data set"):
        create_app(other, tiny_world / "images")
    other.write_text(json.dumps({"bags": {"2": [[1, 2]]}}))
    with pytest.raises(DataError, match="no 'data' entry naming the data set the bags were built on; pass --data"):
        create_app(other, tiny_world / "images")
    # A "data" path relative to the bags file (as a moved folder of bags and data set has it).
    other.write_text(json.dumps({"data": os.path.relpath(tiny_world / "dataset.json", tmp_path),
                                 "bags": json.loads(bags.read_text())["bags"]}))  # fmt: skip
    assert create_app(other, tiny_world / "images").test_client().get("/bag/3/0").status_code == 200


def test_an_images_path_that_is_no_folder_is_named_as_eval_names_it(fabricated_run, tmp_path, capsys):
    # `bags review --images` said "not a folder" where nothing was there, where `eval --images` tells a missing path
    # from a file (tests/app/test_first_day_cli.py): one check says both
    from finecap.app.cli import main

    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    (tmp_path / "afile").write_text("x")
    for images, what in (("nodir", "no such folder"), ("afile", "not a folder")):
        assert main(["bags", "review", str(bags), "--images", str(tmp_path / images), "--port", "0"]) == 2
        assert capsys.readouterr().err.strip() == f"finecap: error: --images {tmp_path / images}: {what} (the image " \
            "folder of the references' relative paths)"  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "bags.json"]  # a failed start wrote nothing


def test_the_curated_file_is_never_written_into_the_image_folder(fabricated_run, tiny_world, tmp_path):
    """`finecap bags review bags.json --images DIR --out DIR/curated.json` wrote the curated file, its decisions file
    and a lock file into the user's image folder: the image folder is one of the command's inputs."""
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    images = shutil.copytree(tiny_world / "images", tmp_path / "images")
    before = sorted(p.relative_to(images) for p in images.rglob("*"))
    for out in (images / "curated.json", images / "test" / "curated.json", images):
        with pytest.raises(OutputRefused, match=f"--out: {out} .*--images"):
            create_app(bags, images, out=out)
    assert sorted(p.relative_to(images) for p in images.rglob("*")) == before


def test_a_bags_file_whose_data_changed_is_refused_at_start(tiny_world, tmp_path, capsys):
    """Without --data the data set named by the bags file is read, checked against the fingerprint the file recorded
    (as `finecap bags build` writes it): data edited since the bags were built stops the review at start."""
    from finecap.app.cli import main
    from finecap.train.fingerprint import bags_data_fingerprint

    data = tmp_path / "data" / "captions.json"
    data.parent.mkdir()
    data.write_text((tiny_world / "dataset.json").read_text())  # a Karpathy file of the world's captions
    built = bags_data_fingerprint("karpathy", data, captions="original", split="test")
    ids = [im["imgid"] for im in json.loads(data.read_text())["images"] if im["split"] == "test"]
    bags = tmp_path / "bags.json"
    bags.write_text(json.dumps({"split": "test", "data": built["path"], "fingerprint": built,
                                "bags": {"3": [{"images": ids[0:3], "similarity": 0.9}]}}))  # fmt: skip
    images = str(tiny_world / "images")
    assert create_app(bags, images).test_client().get("/bag/3/0").status_code == 200  # unchanged data: served

    content = json.loads(data.read_text())
    content["images"][0]["sentences"][0]["raw"] = "a caption edited after the bags were built"
    data.write_text(json.dumps(content))
    now = bags_data_fingerprint("karpathy", data, captions="original", split="test")
    assert now["id"] != built["id"]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["bags", "review", str(bags), "--images", images, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{bags}: the bags were built on data {built['id']}" in err and f"data read now is {now['id']}" in err
    assert f"sha256: '{built['sha256']}' -> '{now['sha256']}'" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing written
    # --data names the data set on purpose: read as given.
    assert create_app(bags, images, data=data).test_client().get("/bag/3/0").status_code == 200


def test_a_bags_file_naming_a_format_of_code_is_refused_before_importing_it(tiny_world, tmp_path, monkeypatch):
    # a bags file is data: its fingerprint's "format" was imported (a dotted path) to fingerprint the data again
    import sys

    from finecap.registry import LEGACY_TRUST_ENV, TRUST_ENV

    for env in (TRUST_ENV, LEGACY_TRUST_ENV):
        monkeypatch.delenv(env, raising=False)
    (tmp_path / "planted_fmt.py").write_text("import sys\nsys.planted_fmt_ran = True\nF = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    bags = tmp_path / "bags.json"
    bags.write_text(json.dumps({"data": str(tiny_world / "dataset.json"), "fingerprint": {"format": "planted_fmt:F"},
                                "bags": {"3": [{"images": [1, 2, 3], "similarity": 0.9}]}}))  # fmt: skip
    with pytest.raises(DataError, match="names the data format 'planted_fmt:F', code of one's own"):
        create_app(bags, tiny_world / "images")
    assert not hasattr(sys, "planted_fmt_ran")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"bags": {"3": [{"images": [[1], [2]]}]}}', "image id \\[1\\] must be an int or a string"),
        ('{"bags": [1, 2]}', "expected an object with 'bags'"),
        ("[" * 100_000, "invalid JSON|nested too deeply"),
    ],
)
def test_a_malformed_bags_file_is_a_named_error_at_start(tiny_world, tmp_path, capsys, text, message):
    from finecap.app.cli import main

    bags = tmp_path / "bags.json"
    bags.write_text(text)
    assert main(["bags", "review", str(bags), "--images", str(tiny_world / "images"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and str(bags) in err and "Traceback" not in err


def test_a_decisions_file_for_other_bags_is_refused_at_start(app_and_paths, capsys):
    app, bags, world = app_and_paths
    post(app.test_client(), "/bag/3/0", "accept")
    data = json.loads(bags.read_text())
    data["bags"]["3"][0], data["bags"]["3"][1] = data["bags"]["3"][1], {"images": data["bags"]["3"][1]["images"][::-1]}
    bags.write_text(json.dumps(data))  # bag 3/0 replaced: a decision by position would now go to the wrong bag
    from finecap.app.cli import main

    assert main(["bags", "review", str(bags), "--images", str(world / "images"), "--port", "0"]) == 2
    assert "made for a different version of" in capsys.readouterr().err


HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)></textarea>{{7*7}}'


def test_hostile_captions_and_file_names_are_escaped_and_served(tiny_world, tmp_path):
    # A data set's references and image file names are the user's (or anyone's) text: printed escaped, never as
    # markup, and an image whose name holds URL syntax (#, ?, %, quotes) is still served by its page's link.
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    dataset = json.loads((world / "dataset.json").read_text())
    test = [im for im in dataset["images"] if im["split"] == "test"][:3]
    for im, name in zip(test, ["a#b?.png", '%41 "q" &amp;.png', "é'<x>.png"], strict=True):
        (world / "images" / im["filepath"] / im["filename"]).rename(world / "images" / im["filepath"] / name)
        im["filename"], im["sentences"][0]["raw"] = name, HOSTILE
    test[0]["sentences"][1]["raw"] = "a circle\u202e"  # a right-to-left override: refused when the data set is read
    (world / "dataset.json").write_text(json.dumps(dataset))
    bags = tmp_path / "bags.json"
    bags.write_text(json.dumps({"bags": {"3": [{"images": [im["imgid"] for im in test]}]}}))
    with pytest.raises(DataError, match=re.escape("caption 1 holds the bidirectional control U+202E")):
        create_app(bags, world / "images", data=world / "dataset.json")
    test[0]["sentences"][1]["raw"] = "a circle\u200f"  # a right-to-left mark: read, and printed isolated
    (world / "dataset.json").write_text(json.dumps(dataset))
    client = create_app(bags, world / "images", data=world / "dataset.json").test_client()
    page = client.get("/bag/3/0").get_data(as_text=True)
    assert "<script>alert" not in page and "<img src=x" not in page and "</textarea>" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x") == 3
    assert page.count("\u200f") == page.count("\u2068a circle\u200f\u2069") == 1
    sources = [html.unescape(s) for s in re.findall(r'<img src="([^"]+)"', page)]
    assert len(sources) == 3
    for src in sources:
        response = client.get(src)
        assert response.status_code == 200 and response.mimetype == "image/png", src


def test_a_right_to_left_override_in_the_bags_files_path_reverses_none_of_the_pages_text(
    fabricated_run, tiny_world, tmp_path
):
    # The page prints where it saves (--out) and the bags file it reads: paths, which the page's printing left bare
    # (only a str was isolated), so a folder or file named with U+202E reversed the page's own text after it up to the
    # end of its paragraph ("Saved after every click to .../bags<RLO>.curated.json (from ...)."). Isolated now.
    rlo = "\u202e"
    folder = tmp_path / f"d{rlo}"
    folder.mkdir()
    bags = folder / f"bags{rlo}.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    page = create_app(bags, tiny_world / "images").test_client().get("/bag/3/0").get_data(as_text=True)
    isolated = [f"\u2068{path}\u202c\u202c\u2069" for path in (default_out(bags), bags)]  # two overrides, closed
    assert [page.count(text) for text in isolated] == [1, 1]
    assert page.count(rlo) == 2 * sum(page.count(text) for text in isolated)  # no override left open


def test_an_image_whose_name_holds_a_colon_is_served(tiny_world, tmp_path):
    # a ':' in the first part of an image's path (a Windows drive's mark, an ordinary character of a POSIX name) was
    # refused: images kept at the image root as 'shot 12:30.png' stopped the start with "none of the 3 bag images is
    # there as an image file (expected e.g. .../shot 12:30.png)", naming a file that is there
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    dataset = json.loads((world / "dataset.json").read_text())
    test = [im for im in dataset["images"] if im["split"] == "test"][:3]
    for k, im in enumerate(test):
        name = f"shot 12:3{k}.png"
        (world / "images" / im["filepath"] / im["filename"]).rename(world / "images" / name)
        im["filepath"], im["filename"] = "", name
    (world / "dataset.json").write_text(json.dumps(dataset))
    bags = tmp_path / "bags.json"
    bags.write_text(json.dumps({"bags": {"3": [{"images": [im["imgid"] for im in test]}]}}))
    client = create_app(bags, world / "images", data=world / "dataset.json").test_client()
    sources = [
        html.unescape(s) for s in re.findall(r'<img src="([^"]+)"', client.get("/bag/3/0").get_data(as_text=True))
    ]
    assert len(sources) == 3
    for src in sources:
        response = client.get(src)
        assert response.status_code == 200 and response.mimetype == "image/png", src
    assert resolve_under(world / "images", "shot 12:30.png") == (world / "images" / "shot 12:30.png").resolve()


def test_the_images_are_read_within_the_configurations_budget(fabricated_run, tiny_world, tmp_path):
    # the app checked and decoded the bag images within the default budget (data.max_image_pixels,
    # data.max_aspect_ratio), not the configuration's: a run that allowed larger images had them refused, one that
    # allowed fewer pixels had them served (the world's images are 40 x 40 = 1,600 pixels)
    from finecap.config import load

    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    with pytest.raises(FileNotFoundError, match="none of the .* bag images is there as an image file"):
        create_app(bags, tiny_world / "images", cfg=load(None, ["data.max_image_pixels=1599"]))
    assert create_app(bags, tiny_world / "images", cfg=load(None, ["data.max_image_pixels=1600"])) is not None


def test_the_token_option_says_a_token_is_generated_on_loopback_too():
    """``finecap bags review --help`` says what :func:`finecap.app.review.main` does: a token is required on loopback
    too, generated when none is given (it said: generated when --host is beyond loopback)."""
    from helpers.cli import run_cli

    code, out, _ = run_cli(["bags", "review", "--help"])
    said = " ".join(out.split())
    assert code == 0 and "on loopback too" in said and "beyond loopback" not in said, said


@pytest.mark.parametrize("how", ["environment", "option"])
def test_a_token_the_user_gave_is_never_printed_and_a_generated_one_is(fabricated_run, tiny_world, tmp_path,
                                                                       monkeypatch, capsys, how):  # fmt: skip
    # the URL printed on stdout carried the token given by FINECAP_REVIEW_TOKEN (or --token): `nohup finecap bags
    # review ... &` and a job scheduler write stdout to a file, which then held it, though the user had kept it out of
    # the command line. As Jupyter does, only a token finecap generated is printed; one the user gave they know.
    from finecap.app import review

    bound = _served_until_interrupted(monkeypatch)
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    secret = "s3cret-given-t0ken & more"
    if how == "environment":
        monkeypatch.setenv(review.TOKEN_ENV, secret)
        review.main(bags, tiny_world / "images", port=0)
    else:
        monkeypatch.delenv(review.TOKEN_ENV, raising=False)
        review.main(bags, tiny_world / "images", port=0, token=secret)
    printed = capsys.readouterr()
    assert "s3cret" not in printed.out + printed.err
    assert "open http://127.0.0.1:8765/?token=... " in printed.out and review.TOKEN_ENV in printed.out
    client = bound[0].test_client()
    assert client.get("/", headers={"Host": "127.0.0.1"}).status_code == 401
    entry = client.get(f"/?{urllib.parse.urlencode({'token': secret})}", headers={"Host": "127.0.0.1"})
    assert entry.status_code == 302  # the token given is the one required
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or "s3cret" not in path.read_text(errors="replace"), path


def test_a_token_file_gives_the_access_token_read_as_serve_reward_reads_one(fabricated_run, tiny_world, tmp_path,
                                                                            monkeypatch, capsys):  # fmt: skip
    # `finecap bags review` took its token on the command line only (--token: in ps, warned about) or from the
    # environment; --token-file is serve-reward's, read by the same function (finecap.utils.token_file.read_token)
    from finecap.app import review
    from finecap.app.cli import main
    from finecap.utils import token_file

    bound = _served_until_interrupted(monkeypatch)
    monkeypatch.delenv(review.TOKEN_ENV, raising=False)
    read: list[str] = []
    real = token_file.read_token
    monkeypatch.setattr(token_file, "read_token", lambda path: read.append(str(path)) or real(path))
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    token = tmp_path / "token"
    token.write_text("s3cret-file-t0ken-0123456789\n")
    os.chmod(token, 0o600)
    assert main(["bags", "review", str(bags), "--images", str(tiny_world / "images"), "--token-file", str(token)]) == 0
    printed = capsys.readouterr()
    assert read == [str(token)] and "s3cret" not in printed.out + printed.err
    assert "warning: --token" not in printed.err  # nothing on the command line to warn about
    assert "open http://127.0.0.1:8765/?token=... " in printed.out and "--token-file" in printed.out
    client = bound[0].test_client()
    assert client.get("/", headers={"Host": "127.0.0.1"}).status_code == 401
    entry = client.get("/?token=s3cret-file-t0ken-0123456789", headers={"Host": "127.0.0.1"})
    assert entry.status_code == 302  # the file's token is the one required
    # serve-reward reads its --token-file through the same function: one home for the checks
    assert main(["serve-reward", "demo/sr_bagcurri", "--token-file", str(tmp_path / "missing")]) == 2
    assert read == [str(token), str(tmp_path / "missing")]


@pytest.mark.parametrize("kind", ["fifo", "shared"])
def test_a_refused_review_token_file_is_one_error_line_before_anything_loads(tmp_path, capsys, monkeypatch, kind):
    # the checks of serve-reward's --token-file: a FIFO (which blocked a read for ever) or a file others can read
    from finecap.app.cli import main

    monkeypatch.chdir(tmp_path)
    token = tmp_path / "token"
    if kind == "fifo":
        os.mkfifo(token, 0o600)
    else:
        token.write_text("s3cret-token-0123456789\n")
        os.chmod(token, 0o644)
    assert main(["bags", "review", str(tmp_path / "bags.json"), "--images", str(tmp_path), "--token-file",
                 str(token)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    said = "not a regular file" if kind == "fifo" else "readable by its group and by other users (mode -rw-r--r--)"
    assert err.startswith(f"finecap: error: --token-file {token}: {said}") and len(err.splitlines()) == 1, err
    assert "s3cret" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["token"]


def test_a_review_token_is_given_one_way_on_the_command_line(tmp_path):
    from helpers.cli import run_cli

    code, _, err = run_cli(["bags", "review", str(tmp_path / "bags.json"), "--images", str(tmp_path), "--token",
                            "s3cret-token-0123456789", "--token-file", str(tmp_path / "token")])  # fmt: skip
    assert code == 2 and "argument --token-file: not allowed with argument --token" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
@pytest.mark.usefixtures("hangup_default")  # a suite run under nohup ignores SIGHUP
def test_the_command_stops_cleanly_on_sigterm_and_on_a_hang_up(fabricated_run, tiny_world, tmp_path, stop):
    """``finecap bags review`` in a process of its own, serving, then stopped: SIGTERM ends it as Ctrl-C does (the
    command line's Terminated, caught; the socket closed; exit 0), and SIGHUP (the SSH session of a server started
    without nohup or tmux dropped) the same way; SIGHUP killed it at its default before (exit -1)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "finecap.app.cli", "bags", "review", str(bags), "--images",
            str(tiny_world / "images"), "--port", "0"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert "Reviewing 3 bags" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))
        # an answer: the server is in its serving loop (the stop's handlers set), not still starting
        assert _answer(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 401"), line
        proc.send_signal(getattr(signal, stop))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err
