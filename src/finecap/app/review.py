"""``finecap bags review BAGS.json --images ROOT``: a local web page to accept or reject candidate TrueMatch bags.

NDLB (Sec. 3) curated its TrueMatch bags by hand. This command serves one page per bag (its images side by side with
their reference captions, accept / reject buttons, the status of every bag in a side list) with Flask on
``127.0.0.1`` (``--host``/``--port``) and prints the URL. Each click is saved before the page answers, by
:class:`finecap.data.curation.BagCuration` (under a lock, read after taking it, written atomically): the curated bag
file (``--out``, default ``<BAGS stem>.curated.json``, the layout ``finecap eval --bags`` reads) and its decisions
file, keyed by each bag's images. Closing the tab or killing the server loses nothing acknowledged, and running the
command again resumes at the first undecided bag.

Captions and image paths come from the data set the bags were built on: the bags file's ``"data"`` (relative to the
bags file when not absolute), checked against the data fingerprint the file recorded (a data set changed since the
bags were built is refused), or ``--data``; image paths are taken relative to ``--images``. Everything is checked at
start, before anything is served: a malformed bags or decisions file, changed data, a data set that holds none of
the bags' images, and an ``--images`` folder under which none of them is found are errors naming the file or folder
(and one expected image path).

Security model (docs/report-and-review.md). The server answers this machine only unless told otherwise, and serves
nothing but the review:

- **Binding and access token.** ``127.0.0.1`` by default; a ``--host`` beyond loopback (``0.0.0.0``, a LAN address)
  prints a warning. Every server requires an access token (``--token-file``, ``--token``, ``FINECAP_REVIEW_TOKEN``,
  or one generated and printed, as Jupyter does), on loopback too: other users of a shared machine reach
  ``127.0.0.1`` as well. The printed URL carries a generated token as ``?token=`` (a given one is the user's to add:
  it is not printed, as the output of a ``nohup`` server lands in a file); the page exchanges it for an ``HttpOnly``,
  ``SameSite=Strict`` cookie. The token is never written to a file, nor to the log of requests on stderr
  (:class:`RequestHandler`).
- **Host check (DNS rebinding).** A request whose ``Host`` is not the bound address or a loopback name
  (``localhost``, ``127.0.0.1``, ``::1``) is refused with 400; bound to a wildcard address, the machine's own names
  and IP literals are accepted too.
- **Origin check and CSRF token (cross-site requests).** A request with an ``Origin`` (or, on a POST without one, a
  ``Referer``) other than the page's own is refused with 403, as is any POST or non-navigation request that the
  browser marks ``Sec-Fetch-Site: cross-site`` or ``same-site``. Every POST must also carry the form's token (random
  per server process, compared in constant time), so a client that sends no Origin at all still cannot forge one.
  This is a small check of our own rather than Flask-WTF: one form with one hidden field needs no form library,
  session or secret key, and the whole policy reads in :func:`create_app`.
- **What is served.** Only the image files of the bags under review: the set of their paths (under ``--images``
  after resolving symlinks, with an image extension and matching leading bytes, :func:`image_type`, and verified as
  an image, :func:`finecap.data.images.check_image_file`) is fixed at start and looked up by exact relative path;
  nothing else under ``--images`` is reachable. What is sent is the decoded image re-encoded
  (:func:`finecap.data.images.decode_image`, :func:`~finecap.data.images.encode_image`), never the file's bytes.
  Bad paths (``..``, absolute, NUL bytes, anything not in the set) are a named 404, never a 500.
- Every response carries ``X-Content-Type-Options: nosniff``, a Content-Security-Policy (scripts and styles only by
  per-response nonce, no framing: ``frame-ancestors 'none'``) and ``Cache-Control: no-store``.

Flask's development server (werkzeug) serves the page: this is a single-user tool, which is what that server is for;
beyond loopback it is plain HTTP (the token and images cross the network unencrypted). :class:`ReviewServer` bounds it:
a connection silent for :data:`READ_TIMEOUT` seconds is closed (a client sending half a request held its thread for
ever), and at most :data:`MAX_CONNECTIONS` are served at once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from finecap.config import Config, load
from finecap.data.curation import BagCuration, CurationBusy
from finecap.data.images import ImageLimits, check_image_file, decode_image, encode_image
from finecap.data.records import DataError, Record
from finecap.data.references import check_image_folder, load_references
from finecap.outputs import OutputRefused, check_not_input
from finecap.report.html import TEMPLATES, printed
from finecap.serve.hosts import WILDCARD_HOSTS, HostPolicy, hostname
from finecap.train.fingerprint import bags_file_data
from finecap.utils.system import MissingExtra, hangup_as_sigterm, is_loopback

REVIEW_EXTRA = "finecap bags review needs Flask: pip install 'finecap[review]'"
"""The one line naming the extra when Flask is missing (this page is finecap's only user of Flask)."""

try:
    from flask import Flask, Response, abort, g, redirect, render_template, request, url_for
    from werkzeug.exceptions import HTTPException
    from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler
except ImportError:  # pragma: no cover - the review extra is in the test extra
    raise MissingExtra(REVIEW_EXTRA) from None

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
TOKEN_ENV = "FINECAP_REVIEW_TOKEN"
"""Environment variable read for the access token when ``--token`` is not given."""
MAX_FORM_BYTES = 64 * 1024
"""The largest request body the server reads (a decision's form is under 200 bytes): a larger one is a 413 before it
is read, where werkzeug spooled any body, 200 MB included, into a temporary file before refusing it. A POST without
a ``Content-Length`` (chunked) is a 411: werkzeug cut such a body at this limit and parsed the part it had read."""
IMAGE_TYPES: dict[str, str] = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
                               ".webp": "image/webp", ".bmp": "image/bmp"}  # fmt: skip
"""Image file extensions served, with their MIME types."""
READ_TIMEOUT = 20.0
"""Seconds a connection may stay silent (send no byte of its request, or read no byte of its answer) before the
server closes it (:class:`ReviewServer`): werkzeug waited for ever, so a client sending half a request (slowloris)
held its thread for good. An idle keep-alive connection of a browser is closed too; the browser opens another."""
MAX_CONNECTIONS = 32
"""Connections served at once, one thread each (:class:`ReviewServer`); one more is closed unanswered. A browser
opens about six to one server; werkzeug started a thread for every connection, without a bound."""


class RequestHandler(WSGIRequestHandler):
    """werkzeug's request handler, its line per request (on stderr) without the query string: the only query the
    page takes is the access token (``?token=``), which werkzeug logged in full, so that a ``nohup`` or job
    scheduler's log of the server held it for anyone who can read that file."""

    def setup(self) -> None:
        self.timeout = getattr(self.server, "read_timeout", None)  # socketserver sets it on the socket (ReviewServer)
        super().setup()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = getattr(self, "path", None)  # unset for a request line that did not parse
        if path is None or "?" not in path:
            return super().log_request(code, size)
        self.path = path.split("?", 1)[0] + "?(query not logged)"  # the request was answered: only the log reads it
        try:
            super().log_request(code, size)
        finally:
            self.path = path


class ReviewServer(ThreadedWSGIServer):
    """werkzeug's threaded server with two bounds, through socketserver's own hooks (no HTTP of ours): each
    connection's socket times out after ``read_timeout`` seconds without a byte (:data:`READ_TIMEOUT`; the handler's
    ``timeout``, which socketserver sets on the socket and werkzeug answers by closing the connection), and at most
    ``max_connections`` are served at once (:data:`MAX_CONNECTIONS`): one arriving beyond them is closed at once,
    unanswered, with a warning, and no thread is started for it. A client trickling a byte within every
    ``read_timeout`` keeps its connection; it holds one of the ``max_connections`` threads, never more.

    ``connections``: the connections being served now. Binding errors are werkzeug's (it prints why and exits 1)."""

    def __init__(self, host: str, port: int, app: Any, *, read_timeout: float = READ_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:  # fmt: skip
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.connections = 0
        self._count = threading.Lock()
        super().__init__(host, port, app, handler=RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count:
            full = self.connections >= self.max_connections
            self.connections += 0 if full else 1
        if full:
            log.warning("review server: %d connections open, the most it serves at once; one from %s closed "
                        "unanswered", self.max_connections, client_address[0])  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # its thread runs process_request_thread
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self._count:
            self.connections -= 1


def default_out(bags: str | Path) -> Path:
    """``BAGS.json`` -> ``BAGS.curated.json`` next to it."""
    bags = Path(bags)
    return bags.with_name(f"{bags.stem}.curated.json")


def resolve_under(root: Path, rel: str) -> Path | None:
    """The file ``root/rel`` when it lies under ``root`` (after resolving symlinks), else None.

    Refused: empty, absolute (``/etc/passwd``) and backslash paths, control characters (NUL), any ``..`` component,
    on Windows any ``:`` (a drive, ``C:x``, or an alternate data stream), and paths that resolve outside ``root`` or
    to something other than a file. A ``:`` is an ordinary character of a POSIX file name (``shot 12:30.png``).
    """
    if not rel or rel.startswith("/") or "\\" in rel or any(ord(c) < 32 for c in rel):
        return None
    if (os.name == "nt" and ":" in rel) or any(part in ("..", "") for part in rel.split("/")):
        return None
    try:
        base = root.resolve()
        path = (base / rel).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            return None
    except (OSError, ValueError):  # a name too long, a loop of symlinks, ...
        return None
    return path


def image_type(path: Path) -> str | None:
    """The MIME type of an image file by its extension (:data:`IMAGE_TYPES`) when its first bytes agree, else None."""
    mime = IMAGE_TYPES.get(path.suffix.lower())
    if mime is None:
        return None
    try:
        with path.open("rb") as f:
            head = f.read(12)
    except OSError:
        return None
    ok = {
        "image/png": head.startswith(b"\x89PNG\r\n\x1a\n"),
        "image/jpeg": head.startswith(b"\xff\xd8\xff"),
        "image/gif": head[:6] in (b"GIF87a", b"GIF89a"),
        "image/webp": head[:4] == b"RIFF" and head[8:12] == b"WEBP",
        "image/bmp": head[:2] == b"BM",
    }[mime]
    return mime if ok else None


def _is_image(path: Path, limits: ImageLimits) -> bool:
    try:
        check_image_file(path, limits)
    except DataError as e:
        log.warning("%s", e)
        return False
    return True


def _data_source(bags: dict[str, Any], bags_path: Path, data: str | Path | None) -> str | Path:
    """``--data`` (the user's choice, not checked), else the bags file's ``"data"`` (a relative path is taken
    relative to the bags file) checked against the fingerprint the file recorded
    (:func:`finecap.train.fingerprint.bags_file_data`: a data set changed since the bags were built is refused)."""
    if data is not None:
        return data
    source = bags.get("data")
    if not source or not isinstance(source, str):
        raise DataError(f"{bags_path}: no 'data' entry naming the data set the bags were built on; pass --data")
    return bags_file_data(bags_path, bags)


def _served_images(
    curation: BagCuration, records: dict[Hashable, Record], root: Path, source: str | Path, limits: ImageLimits
) -> dict[Hashable, str]:
    """``{image id: path relative to root}`` of the bag images that can be served (within the run's ``limits``,
    ``data.max_image_pixels`` and ``data.max_aspect_ratio``); errors when none can."""
    ids = list(dict.fromkeys(i for key in curation.keys() for i in curation.bag(key)))  # noqa: SIM118
    if not ids:
        return {}
    known = [i for i in ids if i in records]
    if not known:
        raise DataError(
            f"{source}: none of the {len(ids)} images of the bags in {curation.bags_path} is in this data set "
            f"(e.g. image id {ids[0]!r}); pass the data set they were built on with --data"
        )
    served: dict[Hashable, str] = {}
    missing: list[Path] = []
    top = Path(os.path.abspath(root))
    for i in known:
        path = Path(os.path.abspath(records[i].path))
        try:
            rel = path.relative_to(top).as_posix()
        except ValueError:
            missing.append(path)
            continue
        found = resolve_under(top, rel)
        if found is None or image_type(found) is None or not _is_image(found, limits):
            missing.append(path)
        else:
            served[i] = rel
    if not served:
        raise FileNotFoundError(f"--images {root}: none of the {len(known)} bag images is there as an image file "
                                f"(expected e.g. {missing[0]}); pass the folder the image paths of {source} are "
                                "relative to")  # fmt: skip
    if missing:
        log.warning("%d of %d bag images are not image files under --images %s (e.g. %s); their bags show without "
                    "them", len(missing), len(known), root, missing[0])  # fmt: skip
    return served


def create_app(
    bags: str | Path, images: str | Path, *, data: str | Path | None = None, out: str | Path | None = None,
    cfg: Config | None = None, host: str = DEFAULT_HOST, token: str | None = None, rebuild: bool = True,
) -> Flask:  # fmt: skip
    """The review app for the bags file ``bags`` with images under ``images``; decisions go to ``out``.

    ``host`` is the address the server binds (it decides which ``Host`` headers are accepted); ``token``, required
    when ``host`` is beyond loopback, is the access token every request must present (module docstring). Once every
    start check passed, the curated and decisions files are rebuilt from the decisions file (``rebuild``; :func:`main`
    does it itself once the server is bound, so that a port in use writes nothing either). ``out`` may be none of
    the inputs (the bags file, ``data``) nor, when given, lie in the image folder
    (:func:`finecap.outputs.check_not_input`); the default, beside the bags file, may (a bags file kept among the
    images)."""
    cfg = cfg if cfg is not None else load()
    limits = ImageLimits.of(cfg.data)  # the budget the bags' run read its images with, not the defaults
    bags_path, root = Path(bags), check_image_folder(images)
    if token is None and not is_loopback(host):
        raise ValueError(f"--host {host}: serving beyond this machine needs an access token (--token)")
    out_path = Path(out) if out is not None else default_out(bags_path)  # its decisions file is beside it
    inputs = {"--bags": bags_path, "--data": data}
    if out is not None:  # the default lies beside the bags file: where the user keeps it, in the image folder or not
        inputs["--images"] = root
    check_not_input(out_path, inputs, option="--out")
    curation = BagCuration(bags_path, out_path, rebuild=False)
    records: dict[Hashable, Record] = {}
    served: dict[Hashable, str] = {}
    if curation.keys():
        source = _data_source(curation.source, bags_path, data)
        records = {r.image_id: r for r in load_references(cfg, source, images=root).records}
        served = _served_images(curation, records, root, source, limits)
    if rebuild:
        curation.rebuild()  # written only once every start check passed
    servable = set(served.values())
    base = root.resolve()

    hosts = HostPolicy(host)
    csrf_token = secrets.token_urlsafe(32)

    app = Flask(__name__, template_folder=str(TEMPLATES))
    app.jinja_options = {**Flask.jinja_options, "finalize": printed}  # the report's printing of user text
    app.config["curation"] = curation
    app.config["csrf_token"] = csrf_token
    app.config["MAX_CONTENT_LENGTH"] = MAX_FORM_BYTES  # a decision's form: werkzeug spooled any body to disk first

    def refuse(code: int, why: str) -> None:
        abort(code, why)

    def same_origin(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme == request.scheme and parts.netloc.lower() == request.host.lower()

    def cookie_name() -> str:
        port = request.host.rsplit(":", 1)[-1] if request.host.rsplit(":", 1)[-1].isdigit() else "80"
        return f"finecap_review_{port}"

    @app.before_request
    def guard() -> Any:
        g.nonce = secrets.token_urlsafe(16)
        if not hosts.accepts(request.host):
            refuse(400, f"Host {request.host!r} is not the address this review server is bound to (a DNS-rebinding "
                        "request?); open the URL it printed")  # fmt: skip
        origin = request.headers.get("Origin")
        if origin is not None and not same_origin(origin):
            refuse(403, f"cross-origin request from {origin} refused")
        site = request.headers.get("Sec-Fetch-Site", "same-origin")
        navigation = request.method in ("GET", "HEAD") and request.headers.get("Sec-Fetch-Mode") == "navigate"
        if site in ("cross-site", "same-site") and not navigation:
            refuse(403, f"{site} request refused")
        if request.method == "POST" and origin is None:
            referer = request.headers.get("Referer")
            if referer is not None and not same_origin(referer):
                refuse(403, f"cross-origin request (Referer {referer}) refused")
        if token is not None:
            given = request.args.get("token")
            if given is not None and secrets.compare_digest(given.encode(), token.encode()):
                query = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
                # the path as the request spelled it (percent-encoded): a decoded CR/LF in it was a 500 (no header)
                response = redirect(quote(request.path) + (f"?{query}" if query else ""))
                response.set_cookie(cookie_name(), token, httponly=True, samesite="Strict")
                return response
            cookie = request.cookies.get(cookie_name(), "")
            if not secrets.compare_digest(cookie.encode(), token.encode()):
                refuse(401, "this review server needs its access token: open the URL with ?token=... that it printed")
        if request.method == "POST":
            if request.content_length is None:  # chunked: werkzeug cut it at MAX_FORM_BYTES and parsed the rest
                refuse(411, "a decision's form is sent with its Content-Length (as browsers send it)")
            sent = request.form.get("csrf_token", "")
            if not secrets.compare_digest(sent.encode(), csrf_token.encode()):
                refuse(400, "missing or stale form token (was the server restarted?); reload the page and decide "
                            "again")  # fmt: skip
        return None

    @app.after_request
    def headers(response: Response) -> Response:
        nonce = g.get("nonce", "")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; img-src 'self' data:; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        )
        return response

    @app.errorhandler(HTTPException)
    def named_error(e: HTTPException) -> Any:
        return Response(f"{e.code} {e.name}: {e.description}\n", status=e.code, mimetype="text/plain")

    @app.errorhandler(CurationBusy)
    def busy(e: CurationBusy) -> Any:
        return Response(f"503 Service Unavailable: {e}\n", status=503, mimetype="text/plain")

    @app.errorhandler(DataError)
    @app.errorhandler(OutputRefused)
    def changed(e: DataError | OutputRefused) -> Any:  # the output files changed under the server (a link planted)
        return Response(f"409 Conflict: {e}\n", status=409, mimetype="text/plain")

    def image_url(image_id: Hashable) -> str | None:
        rel = served.get(image_id)
        return url_for("image", rel=rel) if rel is not None else None

    @app.get("/")
    def index() -> Any:
        if not curation.keys():
            refuse(404, f"{bags_path} holds no bags to review.")
        key = curation.next_pending() or curation.keys()[0]
        return redirect(url_for("bag", key=key))

    @app.get("/bag/<path:key>")
    def bag(key: str) -> Any:
        try:
            ids = curation.bag(key)
        except KeyError as e:
            refuse(404, str(e.args[0]))
        decisions = curation.decisions
        items = [{"id": i, "url": image_url(i), "captions": records[i].captions if i in records else []}
                 for i in ids]  # fmt: skip
        return render_template("review.html", key=key, items=items, similarity=curation.similarity(key),
                               decision=decisions.get(key), keys=curation.keys(), decisions=decisions,
                               counts=curation.counts(), out=curation.out, source=bags_path, csrf_token=csrf_token,
                               nonce=g.nonce)  # fmt: skip

    @app.post("/bag/<path:key>")
    def decide(key: str) -> Any:
        value = request.form.get("decision", "")
        try:
            curation.decide(key, None if value == "undo" else value)
        except KeyError as e:
            refuse(404, str(e.args[0]))
        except ValueError as e:
            if isinstance(e, DataError | OutputRefused):  # not the request's fault: the files on disk (409)
                raise
            refuse(400, str(e))
        following = curation.next_pending(after=key) if value != "undo" else key
        return redirect(url_for("bag", key=following or key), code=303)

    @app.get("/image/<path:rel>")
    def image(rel: str) -> Any:
        path = resolve_under(base, rel) if rel in servable else None
        mime = image_type(path) if path is not None else None
        if path is None or mime is None:
            refuse(404, "not an image of the bags under review (only those are served)")
        try:
            # what is sent: the decoded pixels re-encoded, never the file's bytes
            decoded, fmt = decode_image(path, limits)
        except DataError:
            refuse(404, "not an image of the bags under review that decodes (damaged, or too large)")
        data, mime = encode_image(decoded, fmt)
        return Response(data, mimetype=mime)

    return app


def main(
    bags: str | Path, images: str | Path, *, data: str | Path | None = None, out: str | Path | None = None,
    host: str = DEFAULT_HOST, port: int = 8765, token: str | None = None, cfg: Config | None = None,
) -> None:  # fmt: skip
    """Serve the review app until interrupted (port 0 picks a free port) on a :class:`ReviewServer`; prints the URL.
    Ctrl-C, SIGTERM (under the command line) and a hang-up (SIGHUP: :func:`~finecap.utils.system.hangup_as_sigterm`)
    stop it cleanly.

    ``token`` (default ``$FINECAP_REVIEW_TOKEN``): the access token; generated when none is given, on loopback too
    (another user of the machine reaches ``127.0.0.1`` as well). A generated token is printed in the URL (the user has
    no other way to learn it); a given one never is (``?token=...``, as Jupyter prints a token it did not make): the
    output of a server started with ``nohup`` or by a job scheduler lands in a file. Neither is written to a file."""
    # generated when none is given, loopback or not (module docstring): a shared machine's other users reach it too
    given = token or os.environ.get(TOKEN_ENV)
    token = given or secrets.token_urlsafe(24)
    if not is_loopback(host):
        log.warning("--host %s serves the review page beyond this machine, over plain HTTP: anyone who can reach it "
                    "and has the token can see the bag images and change decisions; the default is %s", host,
                    DEFAULT_HOST)  # fmt: skip
    app = create_app(bags, images, data=data, out=out, cfg=cfg, host=host, token=token, rebuild=False)
    curation: BagCuration = app.config["curation"]
    try:  # a port in use stops here, before anything is written
        server = ReviewServer(host, port, app)
    except SystemExit:  # werkzeug prints why ("Address already in use") and exits 1: a named error instead
        raise OSError(
            f"--host {host} --port {port}: the review server could not listen there (said above; a port in "
            "use: pass another --port, or --port 0 for any free one)"
        ) from None
    try:
        curation.rebuild()
    except BaseException:
        server.server_close()
        raise
    counts = curation.counts()
    shown = socket.gethostname() if hostname(host) in WILDCARD_HOSTS else host
    shown = f"[{shown}]" if ":" in shown else shown
    address = f"http://{shown}:{server.server_port}/"
    if given:  # the user's own token: they know it, and a log of this output would keep it
        how = (f"open {address}?token=... with the token of --token-file, --token or ${TOKEN_ENV} (not printed; "
               "percent-encoded if it holds '&', '#', '+' or a space)")  # fmt: skip
    else:  # the token percent-encoded (a generated one needs none: it is URL-safe)
        how = f"open {address}?{urlencode({'token': token})}"
    print(f"Reviewing {len(curation.keys())} bags of {bags} ({counts['accepted']} accepted, {counts['rejected']} "
          f"rejected so far): {how}")  # fmt: skip
    log.info("Curated bags are written to %s now and after every click (Ctrl+C to stop).", curation.out)
    try:
        with hangup_as_sigterm():  # a dropped SSH session stops it as SIGTERM does (the command line's Terminated)
            server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM (finecap.app.cli.Terminated), SIGHUP
        pass
    finally:
        server.server_close()
