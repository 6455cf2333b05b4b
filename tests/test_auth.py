"""Access control on the real app (in-process, fake queue): tokens, the trusted proxy
header, scopes, the upload rate limit, and the tokens kept only as hashes."""

from __future__ import annotations

import hashlib

import pytest
from api_support import BACKENDS, api_env, upload
from pydantic import ValidationError
from sqlalchemy import select

from server.auth import Identity, check_upload_rate
from server.models import ApiToken, UploadEvent
from server.settings import Settings
from server.tokens import TokenError, create_token, list_tokens, revoke_token


@pytest.fixture(params=BACKENDS)
def env(request, tmp_path, monkeypatch):
    with api_env(request.param, tmp_path, monkeypatch, auth="token") as env:
        yield env


def make_token(env, name: str, scope: str = "upload") -> str:
    with env.factory() as session:
        _, plain = create_token(session, name=name, scope=scope)
        session.commit()
    return plain


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post(env, headers: dict[str, str]):
    env.client.headers.clear()
    env.client.headers.update(headers)
    return upload(env)


def test_upload_needs_a_valid_unrevoked_token(env):
    missing = post(env, {})
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    error = missing.json()["error"]
    assert error["code"] == "unauthorized" and "inspector token create" in error["message"]
    assert post(env, {"Authorization": "Basic dTpw"}).status_code == 401
    assert (
        post(env, bearer("insp_not-a-real-token"))
        .json()["error"]["message"]
        .startswith("invalid API token")
    )
    token = make_token(env, "ci")
    accepted = post(env, bearer(token))
    assert accepted.status_code == 201, accepted.text
    assert len(env.enqueued) == 1  # only the accepted upload reached the queue
    with env.factory() as session:
        revoke_token(session, name_or_id="ci")
        session.commit()
    revoked = post(env, bearer(token))
    assert revoked.status_code == 401 and "was revoked" in revoked.json()["error"]["message"]


def test_reading_by_link_stays_open_listing_and_changes_do_not(env):
    token = make_token(env, "ci")
    slug = post(env, bearer(token)).json()["slug"]
    env.client.headers.clear()
    assert env.client.get(f"/api/v1/reports/{slug}").status_code == 200
    assert env.client.get("/api/v1/reports").status_code == 401
    assert env.client.post(f"/api/v1/reports/{slug}/rerun").status_code == 401
    assert env.client.delete(f"/api/v1/reports/{slug}").status_code == 401
    assert env.client.get("/api/v1/reports", headers=bearer(token)).json()["total"] == 1


def test_deleting_needs_an_admin_token(env):
    token, admin = make_token(env, "ci"), make_token(env, "ops", scope="admin")
    slug = post(env, bearer(token)).json()["slug"]
    env.client.headers.clear()
    forbidden = env.client.delete(f"/api/v1/reports/{slug}", headers=bearer(token))
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    assert env.client.delete(f"/api/v1/reports/{slug}", headers=bearer(admin)).status_code == 204


def test_tokens_are_stored_as_sha256_only(env):
    plain = make_token(env, "ci")
    with env.factory() as session:
        row = session.scalar(select(ApiToken))
        assert row.token_hash == hashlib.sha256(plain.encode()).hexdigest()
        assert all(plain not in str(v) for v in vars(row).values())  # no column holds it
        assert row.prefix == plain[:12] and row.scope == "upload" and row.revoked_at is None
        with pytest.raises(TokenError, match="already named"):
            create_token(session, name="ci")
        revoke_token(session, name_or_id=str(row.id))  # by id
        _, _again = create_token(session, name="ci")  # the name is free once revoked
        assert [t.revoked_at is None for t in list_tokens(session)] == [False, True]


def test_trusted_identity_header_only_when_configured(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch, auth="token") as env:
        assert post(env, {"X-Forwarded-User": "alice"}).status_code == 401  # not trusted
    with api_env("sqlite", tmp_path / "b", monkeypatch, auth="token",
                 trusted_identity_header="X-Forwarded-User") as env:  # fmt: skip
        assert post(env, {"X-Forwarded-User": "alice"}).status_code == 201
        with env.factory() as session:
            assert session.scalar(select(UploadEvent.key)) == "user:alice"


def test_upload_rate_limit_429_with_retry_after(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch, auth="token", upload_rate_per_minute=2) as env:
        token, other = make_token(env, "ci"), make_token(env, "other")
        assert [post(env, bearer(token)).status_code for _ in range(2)] == [201, 201]
        limited = post(env, bearer(token))
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["Retry-After"]) <= 60
        error = limited.json()["error"]
        assert error["code"] == "rate_limited" and error["detail"]["limit_per_minute"] == 2
        assert post(env, bearer(other)).status_code == 201  # counted per token
        assert len(env.enqueued) == 3


def test_rate_window_slides(tmp_path, monkeypatch):
    """Events older than the 60 s window stop counting (and are pruned)."""
    import datetime as dt

    from server.models import utcnow

    with api_env("sqlite", tmp_path, monkeypatch) as env, env.factory() as session:
        who = Identity(kind="token", name="ci", token_id=7)
        old = utcnow() - dt.timedelta(seconds=61)
        session.add_all([UploadEvent(key="token:7", at=old) for _ in range(3)])
        session.commit()
        check_upload_rate(session, who, per_minute=3)  # the 3 old ones no longer count
        assert session.scalars(select(UploadEvent.at)).all() != []
        assert len(session.scalars(select(UploadEvent)).all()) == 1  # pruned, plus this one


def test_open_mode_needs_no_token(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch, upload_rate_per_minute=1) as env:
        assert [upload(env).status_code for _ in range(3)] == [201] * 3  # anonymous: no limit
        assert env.client.get("/api/v1/reports").status_code == 200


def test_auth_settings_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("INSPECTOR_AUTH", "token")
    monkeypatch.setenv("INSPECTOR_TRUSTED_IDENTITY_HEADER", " X-Forwarded-User ")
    monkeypatch.setenv("INSPECTOR_UPLOAD_RATE_PER_MINUTE", "12")
    settings = Settings(data_dir=tmp_path)
    assert (settings.auth, settings.trusted_identity_header) == ("token", "X-Forwarded-User")
    assert settings.upload_rate_per_minute == 12
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, trusted_identity_header="X-User: evil")
    with pytest.raises(ValidationError, match="UPLOAD_RATE_PER_MINUTE"):
        Settings(data_dir=tmp_path, upload_rate_per_minute=-1)
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, auth="password")
