"""Tier options by URL query / disk spec (every tier's options, integrity keys included) and their
errors, which never show a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.tiers import RedisTier, open_tier
from kvoffload.tiers.disk.tier import parse_disk_spec
from tests.tiers.conftest import NS, make_records

URL = "redis://127.0.0.1:6379"  # nothing connects at construction
K1, K2 = "first-secret-0123456789", "second-secret-012345678"


def test_redis_url_query_carries_every_tier_option(tmp_path: Path) -> None:
    recs = make_records(2, 64, seed=50)
    q = f"?integrity_key={K1}&integrity_key={K2}&io_threads=2&batch_keys=3&name=shared&backoff_max=1.5&protocol=2"
    with RedisTier(recs, NS, URL + q) as t:
        assert (t.name, t.io_threads, t.config.protocol) == ("shared", 2, 2)
        assert t.config.tier_options["integrity_key"] == [K1, K2] and t.codec.signs
    with RedisTier(recs, NS, URL + q, io_threads=1, name="kw") as t:  # keywords override the query
        assert (t.name, t.io_threads) == ("kw", 1)
    key_file = tmp_path / "keys"
    key_file.write_text(f"{K2}\n\n{K1}\n")
    with open_tier(f"{URL}?integrity_key_file={key_file}", recs, NS) as t:
        assert t.codec.signs
    signed = {}
    for spec in (f"{URL}?integrity_key={K2}", f"{URL}?integrity_key_file={key_file}"):
        with open_tier(spec, recs, NS) as t:
            signed[spec] = t.codec.header(b"k", recs[0])
    assert len(set(signed.values())) == 1  # the file's first key signs


def test_disk_spec_carries_every_tier_option() -> None:
    path, opts = parse_disk_spec(f"disk:/x?max_bytes=9&integrity_key={K1}&integrity_key={K2}&backoff_max=2&name=d")
    assert (path, opts) == ("/x", {"max_bytes": 9, "integrity_key": [K1, K2], "backoff_max": 2.0, "name": "d"})


@pytest.mark.parametrize(
    "spec, needle",
    [
        (f"{URL}?protocol=4", "protocol"),
        (f"{URL}?io_threads=x&integrity_key={K1}", "io_threads"),
        (f"{URL}?backoff_max=soon&integrity_key={K1}", "backoff_max"),
        (f"{URL}?integrity_key=short", "integrity_key"),
        (f"{URL}?integrity_key_file=/nonexistent/keys", "integrity_key_file"),
        (f"{URL}?bogus=1&password={K1}", "bogus"),
        (f"disk:/x?io_threads=-1&integrity_key={K1}", "io_threads"),
    ],
)
def test_bad_options_are_typed_errors_without_secrets(spec: str, needle: str) -> None:
    recs = make_records(2, 64, seed=51)
    with pytest.raises(ValueError, match=needle) as exc:
        open_tier(spec, recs, NS)
    assert K1 not in str(exc.value)
