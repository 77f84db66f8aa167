"""``finecap bags review BAGS.json --images ROOT``: a local web page to accept or reject candidate TrueMatch bags.

NDLB (Sec. 3) curated its TrueMatch bags by hand. This command serves one page per bag (its images side by side with
their reference captions, accept / reject buttons, the status of every bag in a side list) with Flask on
``127.0.0.1`` (``--host``/``--port``) and prints the URL. Each click is saved at once by
:class:`finecap.data.curation.BagCuration`: the curated bag file (``--out``, default ``<BAGS stem>.curated.json``,
the layout ``finecap eval --bags`` reads) and its decisions file, so closing the tab or killing the server loses
nothing and running the command again resumes at the first undecided bag.

Captions and image paths come from the data set the bags were built on (the bags file's ``"data"``, or ``--data``);
image paths are taken relative to ``--images``. Only files under that root are served: ``/image/<path>`` refuses
absolute paths, ``..`` components and symlinks that lead outside it (:func:`resolve_under`).

Flask's development server (werkzeug) serves the page: this is a single-user tool on the local machine, which is
what that server is for; do not expose it on a public interface.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path, PurePosixPath
from typing import Any

from flask import Flask, abort, redirect, render_template, request, send_file, url_for

from finecap.config import Config, load
from finecap.data.curation import BagCuration
from finecap.data.formats import Record
from finecap.data.references import load_references
from finecap.report.html import TEMPLATES

DEFAULT_HOST = "127.0.0.1"


def default_out(bags: str | Path) -> Path:
    """``BAGS.json`` -> ``BAGS.curated.json`` next to it."""
    bags = Path(bags)
    return bags.with_name(f"{bags.stem}.curated.json")


def resolve_under(root: Path, rel: str) -> Path | None:
    """The file ``root/rel`` when it lies under ``root`` (after resolving symlinks), else None.

    Refused: empty, absolute (``/etc/passwd``, ``C:\\x``) and backslash paths, any ``..`` component, and paths that
    resolve outside ``root`` or to something other than a file.
    """
    if not rel or rel.startswith("/") or "\\" in rel or ":" in PurePosixPath(rel).parts[0]:
        return None
    if any(part in ("..", "") for part in rel.split("/")):
        return None
    base = root.resolve()
    path = (base / rel).resolve()
    if not path.is_relative_to(base) or not path.is_file():
        return None
    return path


def _records(bags: dict[str, Any], bags_path: Path, images: Path, data: str | Path | None, cfg: Config) -> dict:
    """Records by image id of the data set the bags come from (empty when it cannot be found)."""
    source = data if data is not None else bags.get("data")
    if not source:
        print(f"{bags_path}: no 'data' entry naming the data set; pass --data to show captions")
        return {}
    refs = load_references(cfg, source, images=images)
    return {r.image_id: r for r in refs.records}


def create_app(
    bags: str | Path, images: str | Path, *, data: str | Path | None = None, out: str | Path | None = None,
    cfg: Config | None = None,
) -> Flask:  # fmt: skip
    """The review app for the bags file ``bags`` with images under ``images``; decisions go to ``out``."""
    cfg = cfg if cfg is not None else load()
    bags_path, root = Path(bags), Path(images)
    if not root.is_dir():
        raise FileNotFoundError(f"--images {root}: not a folder")
    curation = BagCuration(bags_path, out if out is not None else default_out(bags_path))
    records: dict[Hashable, Record] = _records(curation.source, bags_path, root, data, cfg)
    base = root.resolve()

    app = Flask(__name__, template_folder=str(TEMPLATES))
    app.config["curation"] = curation

    def image_url(image_id: Hashable) -> str | None:
        record = records.get(image_id)
        if record is None:
            return None
        try:
            rel = record.path.resolve().relative_to(base)
        except ValueError:
            return None  # outside the image root: never served
        return url_for("image", rel=rel.as_posix())

    @app.get("/")
    def index() -> Any:
        if not curation.keys():
            return f"{bags_path} holds no bags to review.", 404
        key = curation.next_pending() or curation.keys()[0]
        return redirect(url_for("bag", key=key))

    @app.get("/bag/<path:key>")
    def bag(key: str) -> Any:
        try:
            ids = curation.bag(key)
        except KeyError:
            abort(404)
        items = [{"id": i, "url": image_url(i), "captions": records[i].captions if i in records else []}
                 for i in ids]  # fmt: skip
        return render_template("review.html", key=key, items=items, similarity=curation.similarity(key),
                               decision=curation.decisions.get(key), keys=curation.keys(),
                               decisions=curation.decisions, counts=curation.counts(), out=curation.out,
                               source=bags_path)  # fmt: skip

    @app.post("/bag/<path:key>")
    def decide(key: str) -> Any:
        value = request.form.get("decision", "")
        try:
            curation.decide(key, None if value == "undo" else value)
        except KeyError:
            abort(404)
        except ValueError as e:
            abort(400, str(e))
        following = curation.next_pending(after=key) if value != "undo" else key
        return redirect(url_for("bag", key=following or key))

    @app.get("/image/<path:rel>")
    def image(rel: str) -> Any:
        path = resolve_under(base, rel)
        if path is None:
            abort(404)
        return send_file(path)

    return app


def main(
    bags: str | Path, images: str | Path, *, data: str | Path | None = None, out: str | Path | None = None,
    host: str = DEFAULT_HOST, port: int = 8765, cfg: Config | None = None,
) -> None:  # fmt: skip
    """Serve the review app until interrupted (port 0 picks a free port); prints the URL."""
    from werkzeug.serving import make_server

    app = create_app(bags, images, data=data, out=out, cfg=cfg)
    curation: BagCuration = app.config["curation"]
    server = make_server(host, port, app, threaded=True)
    counts = curation.counts()
    print(f"Reviewing {len(curation.keys())} bags of {bags} ({counts['accepted']} accepted, {counts['rejected']} "
          f"rejected so far): open http://{host}:{server.server_port}/")  # fmt: skip
    print(f"Curated bags are saved to {curation.out} after every click (Ctrl+C to stop).")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
