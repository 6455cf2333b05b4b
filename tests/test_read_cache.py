"""Done reports served from memory (server.readcache): the same bytes as a fresh build,
gzip once, ETag and 304, never a report that is not done, gone on delete and after the TTL
when another process deletes it, and a byte bound that evicts the least recently used."""

from __future__ import annotations

import gzip
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from pages_data import small_report, synthetic_report
from pages_server import insert_job, make_settings
from pydantic import ValidationError
from sqlalchemy import delete, update
from sqlalchemy.orm import Session, sessionmaker

from server.app import create_app
from server.models import Job
from server.pages.report import PICKER_TTL_S
from server.readcache import ENTRY_OVERHEAD_BYTES, ReadCache, accepts_gzip
from server.settings import Settings

TTL_S = 30.0
PLAIN = {"Accept-Encoding": "identity"}
GZIP = {"Accept-Encoding": "gzip"}


def DONE() -> bool:  # noqa: N802 - reads like the constant it is
    return True


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Site:
    client: TestClient
    factory: sessionmaker[Session]
    cache: ReadCache
    clock: Clock

    def add(self, report=None, **kwargs) -> str:  # noqa: ANN001
        return insert_job(self.factory, report or small_report(), name="r", **kwargs)

    def set_job(self, slug: str, **values) -> None:  # noqa: ANN003 - a worker or `gc` elsewhere
        with self.factory() as session:
            session.execute(update(Job).where(Job.slug == slug).values(**values))
            session.commit()

    def remove_job(self, slug: str) -> None:
        with self.factory() as session:
            session.execute(delete(Job).where(Job.slug == slug))
            session.commit()


def make_site(settings: Settings) -> Site:
    app = create_app(settings)
    clock = Clock()
    app.state.read_cache = ReadCache(settings.read_cache_bytes, TTL_S, clock=clock)
    return Site(TestClient(app), app.state.session_factory, app.state.read_cache, clock)


@pytest.fixture
def site(tmp_path):
    return make_site(make_settings(tmp_path / "data"))


def raw_get(client: TestClient, path: str, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """Status, headers and the body exactly as sent (not decompressed)."""
    with client.stream("GET", path, headers=headers) as r:
        return r.status_code, dict(r.headers), b"".join(r.iter_raw())


PATHS = ["/api/v1/reports/{}", "/r/{}"]


@pytest.mark.parametrize("path", PATHS)
def test_a_hit_serves_the_bytes_an_uncached_server_builds(tmp_path, path):
    settings = make_settings(tmp_path / "data")
    site = make_site(settings)
    uncached = make_site(settings.model_copy(update={"read_cache_bytes": 0}))
    slug = site.add(synthetic_report(200))
    first = site.client.get(path.format(slug), headers=PLAIN)
    fresh = uncached.client.get(path.format(slug), headers=PLAIN)
    site.remove_job(slug)  # only memory can answer now
    hit = site.client.get(path.format(slug), headers=PLAIN)
    assert first.status_code == hit.status_code == fresh.status_code == 200
    assert hit.content == first.content == fresh.content
    assert len(site.cache) == (1 if "api" in path else 2) and len(uncached.cache) == 0
    assert uncached.client.get(path.format(slug)).status_code == 404  # it reads the database


@pytest.mark.parametrize("path", PATHS)
def test_gzip_body_decompresses_to_the_identical_body(site, path):
    slug = site.add(synthetic_report(200))
    status, headers, plain = raw_get(site.client, path.format(slug), PLAIN)
    assert status == 200 and "content-encoding" not in headers
    status, headers, zipped = raw_get(site.client, path.format(slug), GZIP)
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert headers["vary"] == "Accept-Encoding"
    assert int(headers["content-length"]) == len(zipped) < len(plain) / 5  # repetitive report
    assert gzip.decompress(zipped) == plain
    if path.startswith("/api"):
        assert json.loads(gzip.decompress(zipped))["report"]["capture"]["node_count"] > 200


def test_accept_encoding_is_read_with_its_weights():
    assert accepts_gzip("gzip, deflate, br") and accepts_gzip("br;q=1.0, gzip;q=0.5")
    assert accepts_gzip("*") and accepts_gzip("x-gzip")
    assert not accepts_gzip(None) and not accepts_gzip("identity") and not accepts_gzip("br")
    assert not accepts_gzip("gzip;q=0") and not accepts_gzip("*, gzip; q=0")


@pytest.mark.parametrize("path", PATHS)
def test_matching_if_none_match_gets_304_without_a_body(site, path):
    slug = site.add()
    plain = site.client.get(path.format(slug), headers=PLAIN)
    zipped = site.client.get(path.format(slug), headers=GZIP)
    etag, gzip_etag = plain.headers["etag"], zipped.headers["etag"]
    assert etag.startswith('"') and gzip_etag == etag[:-1] + '-gzip"'  # strong, one per coding
    assert plain.headers["cache-control"] == "private, no-cache"
    for sent in (etag, gzip_etag, f'"other", W/{etag}', "*"):
        status, headers, body = raw_get(
            site.client, path.format(slug), GZIP | {"If-None-Match": sent}
        )
        assert (status, body, headers["etag"]) == (304, b"", gzip_etag), sent
    again = site.client.get(path.format(slug), headers=PLAIN | {"If-None-Match": '"other"'})
    assert again.status_code == 200 and again.content == plain.content


def test_the_etag_follows_the_content(site):
    a, b = site.add(small_report()), site.add(synthetic_report(20))
    tags = {site.client.get(f"/api/v1/reports/{s}").headers["etag"] for s in (a, b, a)}
    assert len(tags) == 2


def test_a_report_that_is_not_done_is_never_kept(site):
    slug = insert_job(site.factory, None, name="q", status="queued", progress=0)
    api, page = f"/api/v1/reports/{slug}", f"/r/{slug}"
    assert site.client.get(api).json()["status"] == "queued"
    assert "etag" not in site.client.get(api).headers
    site.set_job(slug, status="running", stage="capture", progress=40)
    got = site.client.get(api).json()
    assert (got["status"], got["progress"]) == ("running", 40)  # live, not a kept copy
    assert site.client.get(page).status_code == 200 and len(site.cache) == 0
    site.set_job(slug, status="failed", error_kind="user_error", error_message="boom")
    assert site.client.get(api).json()["error"]["message"] == "boom"
    assert "boom" in site.client.get(page).text and len(site.cache) == 0
    site.set_job(slug, status="done", report_json=small_report().model_dump(mode="json"))
    assert site.client.get(api).json()["report"]["totals"]["params"] > 0
    assert 'id="report-name"' in site.client.get(page).text
    assert len(site.cache) == 3  # done: now kept, the JSON, the page and the listed page


def test_delete_drops_the_kept_bodies(site):
    slug = site.add()
    for path in PATHS:
        assert site.client.get(path.format(slug)).status_code == 200
    assert len(site.cache) == 3  # the JSON, the page and the page with "compare with" choices
    assert site.client.delete(f"/api/v1/reports/{slug}").status_code == 204
    assert len(site.cache) == 0
    assert [site.client.get(p.format(slug)).status_code for p in PATHS] == [404, 404]


def test_a_body_built_across_a_delete_is_not_kept():
    cache = ReadCache(10**6, TTL_S, clock=Clock())

    def build_then_deleted():  # noqa: ANN202 - read as done, then deleted before it is kept
        entry = cache.entry(b"{}", "application/json")
        cache.drop("s")
        return entry

    assert cache.fetch(("json", "s", ""), build_then_deleted, still_done=DONE).body == b"{}"
    assert len(cache) == 0


def test_deleted_elsewhere_is_served_until_the_ttl_then_gone(site):
    slug, kept = site.add(), site.add()
    bodies = {s: site.client.get(f"/api/v1/reports/{s}").content for s in (slug, kept)}
    site.remove_job(slug)  # `inspector gc`, or another web process, deleted it
    site.clock.now += TTL_S - 1
    assert site.client.get(f"/api/v1/reports/{slug}").status_code == 200  # still in memory
    site.clock.now += 2  # past the TTL: asked the database again
    assert site.client.get(f"/api/v1/reports/{slug}").status_code == 404
    assert site.client.get(f"/r/{slug}").status_code == 404
    again = site.client.get(f"/api/v1/reports/{kept}")  # still there: kept, checked again
    assert again.status_code == 200 and again.content == bodies[kept]
    site.remove_job(kept)
    site.clock.now += TTL_S - 1  # the check above renewed it for another TTL
    assert site.client.get(f"/api/v1/reports/{kept}").status_code == 200


def test_one_request_checks_an_old_entry_the_others_are_served_meanwhile():
    clock = Clock()
    cache = ReadCache(10**6, TTL_S, clock=clock)
    key = ("json", "s", "")
    kept = cache.fetch(key, lambda: cache.entry(b"{}", "application/json"), still_done=DONE)
    clock.now += TTL_S  # old: the next request asks the database
    asking, answer = threading.Event(), threading.Event()
    asked: list[str] = []

    def slow_check() -> bool:
        asked.append("slow")
        asking.set()
        return answer.wait(10)

    def count_check() -> bool:
        asked.append("other")
        return True

    with ThreadPoolExecutor(1) as pool:
        checking = pool.submit(cache.fetch, key, lambda: "built", still_done=slow_check)
        assert asking.wait(10)
        assert cache.peek(key) is kept  # while one asks, the kept body still goes out
        assert cache.fetch(key, lambda: "built", still_done=count_check) is kept
        answer.set()
        assert checking.result(10) is kept
    assert asked == ["slow"]  # one question to the database, not one per request
    assert cache.peek(key) is kept  # answered "still done": fresh again
    clock.now += TTL_S
    assert cache.peek(key) is None  # old, nobody asking: the next request must ask


def test_the_links_follow_the_base_url_the_client_used(site):
    slug = site.add()
    mine = site.client.get(f"/api/v1/reports/{slug}").json()
    theirs = site.client.get(f"/api/v1/reports/{slug}", headers={"Host": "other.example"}).json()
    assert mine["url"] == f"http://testserver/r/{slug}"
    assert theirs["url"] == f"http://other.example/r/{slug}"  # not the first caller's copy


def test_the_compare_picker_shows_new_reports_after_a_while(site):
    slug, first = site.add(), site.add()
    page = site.client.get(f"/r/{slug}").text
    choices = page.split('id="compare-options">')[1].split("</datalist>")[0]
    assert first in choices and slug not in choices
    assert slug in site.client.get(f"/r/{first}").text  # a second page, kept too
    second = site.add()
    assert second not in site.client.get(f"/r/{slug}").text  # the list is read every 5 s
    site.clock.now += PICKER_TTL_S
    assert second in site.client.get(f"/r/{slug}").text  # a new list: the choices again
    assert second in site.client.get(f"/r/{first}").text  # every page kept with the old list


def test_a_listed_page_is_the_page_rendered_with_its_choices(tmp_path, monkeypatch):
    import server.pages.report as reportpage

    settings = make_settings(tmp_path / "data", auth="token", trusted_identity_header="X-User")
    site = make_site(settings)
    slug, _other = site.add(), site.add()
    spliced = site.client.get(f"/r/{slug}", headers=PLAIN | {"X-User": "ada"}).content
    choices = [c for c in site.cache._memos["recent_done"][0] if c.slug != slug]
    render = reportpage.render

    def rendered_with_choices(request, name, status_code=200, **context):  # noqa: ANN001, ANN202
        if name == "report.html":
            context["others"] = choices
        return render(request, name, status_code, **context)

    monkeypatch.setattr(reportpage, "render", rendered_with_choices)
    whole = make_site(settings).client.get(f"/r/{slug}", headers=PLAIN)  # renders it all at once
    assert len(choices) == 1 and spliced == whole.content


def test_a_signed_in_page_is_not_served_to_anonymous_readers(tmp_path):
    settings = make_settings(tmp_path / "data", auth="token", trusted_identity_header="X-User")
    site = make_site(settings)
    slug, other = site.add(), site.add()
    assert other in site.client.get(f"/r/{slug}", headers={"X-User": "ada"}).text
    anonymous = site.client.get(f"/r/{slug}")
    assert anonymous.status_code == 200 and other not in anonymous.text  # the picker is for listers
    assert len(site.cache) == 2  # two pages kept apart: with and without the choices
    assert other in site.client.get(f"/r/{slug}", headers={"X-User": "ada"}).text
    assert other not in site.client.get(f"/r/{slug}").text


def test_a_token_is_looked_up_before_a_listed_page_is_served(tmp_path):
    from server.tokens import create_token

    site = make_site(make_settings(tmp_path / "data", auth="token"))
    slug, other = site.add(), site.add()
    with site.factory() as session:
        _, token = create_token(session, name="ci")
        session.commit()
    for _ in range(2):  # built, then kept: each time the token is checked first
        assert other in site.client.get(f"/r/{slug}", headers=bearer(token)).text
        assert other not in site.client.get(f"/r/{slug}", headers=bearer("insp_wrong")).text
        assert other not in site.client.get(f"/r/{slug}").text


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_lru_evicts_past_the_byte_bound():
    clock = Clock()
    probe = ReadCache(10**6, TTL_S, clock=clock).entry(b"x" * 1000, "text/plain")
    cache = ReadCache(3 * probe.size, TTL_S, clock=clock)  # room for three such entries

    def get(slug: str, body: bytes = b"x" * 1000) -> None:
        cache.fetch(("json", slug, ""), lambda: cache.entry(body, "text/plain"), still_done=DONE)

    for slug in ("a", "b", "c"):
        get(slug)
    assert len(cache) == 3 and cache.bytes == 3 * probe.size
    get("a")  # used again: "b" is now the least recently used
    get("d")
    assert {key[1] for key in cache._entries} == {"a", "c", "d"}
    assert cache.bytes <= cache.max_bytes
    get("huge", b"y" * (3 * probe.size))  # larger than the whole bound: served, not kept
    assert "huge" not in {key[1] for key in cache._entries} and len(cache) == 3


def test_a_body_is_built_once_and_other_answers_pass_through():
    cache = ReadCache(10**6, TTL_S, clock=Clock())
    builds = []

    def build():  # noqa: ANN202 - slow enough for every thread to ask while it runs
        builds.append(1)
        time.sleep(0.2)
        return cache.entry(b"{}", "application/json")

    key = ("json", "s", "")
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: cache.fetch(key, build, still_done=DONE), range(8)))
    assert len(builds) == 1 and all(g is got[0] for g in got)  # one build, seven waited
    assert got[0].size == 2 + len(got[0].gzipped) + ENTRY_OVERHEAD_BYTES
    assert cache.fetch(("json", "t", ""), lambda: "not done", still_done=DONE) == "not done"
    assert len(cache) == 1  # what is not a `Cached` (a job not done) is not kept


def test_while_a_new_variant_is_built_the_previous_one_is_served():
    cache = ReadCache(10**6, TTL_S, clock=Clock())
    key = ("page", "s", "lister")
    old = cache.fetch(key, lambda: cache.entry(b"old", "text/html", tag="a"), still_done=DONE)
    started, release = threading.Event(), threading.Event()

    def slow_build():  # noqa: ANN202
        started.set()
        release.wait(10)
        return cache.entry(b"new", "text/html", tag="b")

    with ThreadPoolExecutor(1) as pool:
        building = pool.submit(cache.fetch, key, slow_build, still_done=DONE, tag="b")
        assert started.wait(10)
        meanwhile = cache.fetch(key, slow_build, still_done=DONE, tag="b")
        release.set()
        new = building.result(10)
    assert meanwhile is old and new.body == b"new"
    assert cache.fetch(key, slow_build, still_done=DONE, tag="b") is new


def test_settings_of_the_cache_and_the_job_priority():
    s = Settings()
    assert (s.read_cache_bytes, s.read_cache_ttl_s, s.job_nice) == (256 * 1024**2, 30.0, 10)
    assert Settings(read_cache_bytes="64MiB").read_cache_bytes == 64 * 1024**2
    for bad, message in (
        ({"read_cache_bytes": -1}, "INSPECTOR_READ_CACHE_BYTES"),
        ({"read_cache_ttl_s": 0}, "INSPECTOR_READ_CACHE_TTL_S must be positive"),
        ({"job_nice": 20}, "INSPECTOR_JOB_NICE"),
        ({"job_nice": -5}, "INSPECTOR_JOB_NICE"),
    ):
        with pytest.raises(ValidationError, match=message):
            Settings(**bad)
