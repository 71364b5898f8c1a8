"""The management UI's files: served from the package at /ui/, / redirects there,
revalidation with ETags, security headers, nothing from elsewhere."""

from __future__ import annotations

import re

import pytest

from broker.api.ui import load_ui_files
from tests.support.http import HTTPClient, assert_error


@pytest.mark.parametrize("path", ["/", "/ui"])
async def test_root_redirects_to_the_ui(client: HTTPClient, path: str) -> None:
    reply = await client.get(path)
    assert reply.status == 302 and reply.headers["location"] == "/ui/"


async def test_index_and_assets(client: HTTPClient) -> None:
    reply = await client.get("/ui/")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    csp = reply.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert b'<script type="module" src="app.js">' in reply.body
    js = await client.get("/ui/app.js")
    assert js.status == 200 and js.headers["content-type"] == "text/javascript; charset=utf-8"
    css = await client.get("/ui/style.css")
    assert css.headers["content-type"] == "text/css; charset=utf-8"


async def test_a_repeated_load_is_not_modified(client: HTTPClient) -> None:
    first = await client.get("/ui/app.js")
    etag = first.headers["etag"]
    again = await client.get("/ui/app.js", headers=[("If-None-Match", etag)])
    assert again.status == 304 and again.body == b"" and again.headers["etag"] == etag
    assert (await client.get("/ui/app.js", headers=[("If-None-Match", '"other"')])).status == 200


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/..%2Fapi%2Fui.py", "/ui/%2Fetc%2Fpasswd", "/ui/ui.py"])
async def test_only_the_packaged_files_are_served(client: HTTPClient, path: str) -> None:
    assert_error(await client.get(path), 404, "not_found")


def test_every_file_is_self_contained() -> None:
    """Nothing is fetched from elsewhere: no absolute URL in any script, style or page,
    and every module a script imports is one of the packaged files."""
    files = load_ui_files()
    assert {"index.html", "app.js", "api.js", "style.css"} <= set(files)
    for name, f in files.items():
        text = f.body.decode()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), name
        assert not re.search(r"""url\(\s*["']?(https?:)?//""", text), name
        assert not re.search(r"""from\s+["'](https?:)?//""", text), name
        for imported in re.findall(r"""from\s+["']\./([^"']+)["']""", text):
            assert imported in files, f"{name} imports {imported}, which is not packaged"
    page = files["index.html"].body.decode()
    for linked in re.findall(r'(?:src|href)="([^"#]+)"', page):
        assert linked in files, f"index.html links {linked}, which is not packaged"
    modules = {n for n in files if n.endswith(".js") and n != "app.js"}
    assert set(re.findall(r'rel="modulepreload" href="([^"]+)"', page)) == modules
