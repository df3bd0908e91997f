"""The API key table (auth/keys.py): secrets shown once, digests kept, constant-time checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ollamatrio.auth.keys import SECRET_PREFIX, KeyRequestError, KeyStore, Limits


def test_a_created_key_verifies_lists_without_its_secret_and_is_gone_once_revoked(tmp_path):
    store = KeyStore.in_folder(tmp_path / "state")
    key, secret = store.create("ci-bot", ["inference", "metrics"], Limits(rpm=60, tpm=0))
    assert secret.startswith(SECRET_PREFIX + key.prefix)
    assert len(secret) > 40
    assert store.verify(secret) == key
    assert store.verify(secret[:-1] + ("a" if secret[-1] != "a" else "b")) is None
    assert store.verify("not-ours") is None
    (listed,) = store.list()
    assert (listed.name, listed.scopes, listed.limits.rpm) == (
        "ci-bot",
        {"inference", "metrics"},
        60,
    )
    store.mark_used({"ci-bot": 123.0})
    assert store.list()[0].last_used_at == 123.0
    assert store.revoke("ci-bot")
    assert not store.revoke("ci-bot")
    assert store.verify(secret) is None


def test_the_secret_is_never_stored(tmp_path: Path):
    store = KeyStore.in_folder(tmp_path)
    _, secret = store.create("a", ["admin"])
    for path in tmp_path.iterdir():
        assert secret.encode() not in path.read_bytes()
    assert (store.path.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize(
    ("name", "scopes", "limits", "message"),
    [
        ("bad name", ["admin"], None, "invalid key name"),
        ("a", [], None, "scopes must be"),
        ("a", ["root"], None, "scopes must be"),
        ("a", ["admin"], Limits(rpm=-1), "limits must be"),
    ],
)
def test_bad_requests_are_refused(tmp_path, name, scopes, limits, message):
    with pytest.raises(KeyRequestError, match=message):
        KeyStore.in_folder(tmp_path).create(name, scopes, limits)


def test_a_name_is_taken_once(tmp_path):
    store = KeyStore.in_folder(tmp_path)
    store.create("a", ["admin"])
    with pytest.raises(KeyRequestError, match="exists already"):
        store.create("a", ["inference"])
