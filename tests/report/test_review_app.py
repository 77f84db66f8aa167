"""`finecap bags review` app through Flask's test client: pages, decisions saved as made, resume, path safety."""

import json
import os

import pytest

from finecap.app.review import create_app, default_out, resolve_under
from finecap.data.formats import read_bags


@pytest.fixture
def app_and_paths(fabricated_run, tiny_world, tmp_path):
    bags = tmp_path / "bags.json"
    bags.write_text((fabricated_run / "bags_test.json").read_text())
    app = create_app(bags, tiny_world / "images")
    return app, bags, tiny_world


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
    assert image.status_code == 200 and image.data[:8] == b"\x89PNG\r\n\x1a\n"

    after = client.post("/bag/3/0", data={"decision": "accept"})
    assert after.status_code == 302 and after.headers["Location"].endswith("/bag/3/1")  # next undecided bag
    client.post("/bag/3/1", data={"decision": "reject"})
    out = default_out(bags)
    assert out.name == "bags.curated.json" and read_bags(out)[3] == [ids]  # saved on the click, no shutdown needed
    assert 'class="status accept"' in client.get("/bag/3/0").get_data(as_text=True)

    # A new app on the same files (server restarted, tab reopened) resumes: first undecided bag, decisions kept.
    again = create_app(bags, world / "images").test_client()
    assert again.get("/").headers["Location"].endswith("/bag/5/0")
    assert 'class="status reject"' in again.get("/bag/3/1").get_data(as_text=True)
    assert again.post("/bag/3/1", data={"decision": "maybe"}).status_code == 400
    assert again.get("/bag/7/0").status_code == 404


def test_an_empty_bags_file_says_so(tiny_world, tmp_path):
    bags = tmp_path / "empty.json"
    bags.write_text('{"bags": {"3": []}}')
    response = create_app(bags, tiny_world / "images").test_client().get("/")
    assert response.status_code == 404 and "holds no bags" in response.get_data(as_text=True)


def test_only_files_under_the_image_root_are_served(app_and_paths, tmp_path):
    app, _, world = app_and_paths
    secret = world / "dataset.json"  # exists, one level above the image root
    client = app.test_client()
    for url in ["/image/../dataset.json", "/image/..%2Fdataset.json", "/image/%2E%2E/dataset.json",
                f"/image/{secret}", f"/image/%2F{str(secret).lstrip('/')}", "/image//etc/passwd",
                "/image/%2Fetc%2Fpasswd", "/image/..\\dataset.json", "/image/x/../../dataset.json"]:  # fmt: skip
        response = client.get(url, follow_redirects=True)  # werkzeug merges slashes by redirecting
        assert response.status_code == 404, url
        assert b'"images"' not in response.data, url
    root = world / "images"
    assert resolve_under(root, "../dataset.json") is None
    assert resolve_under(root, str(secret)) is None
    assert resolve_under(root, "C:/x.png") is None
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
