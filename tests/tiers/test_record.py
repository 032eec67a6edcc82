"""The namespace fingerprint and the value codec, checked against independently built bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct

import numpy as np
import pytest
import xxhash

from kvoffload.tiers import RECORD_FORMAT_VERSION, RecordCodec, TierNamespace
from kvoffload.tiers.record import ValueRejected
from tests.tiers.conftest import NS

CHANGED = {
    "model_id": "other/model",
    "k_dtype": "bfloat16",
    "v_dtype": "fp8_e4m3",
    "layout": "flashinfer",
    "page_geometry": (2, 16, 8, 64),
    "tokens_per_block": 32,
    "gpu_blocks_per_block": 2,
    "groups": ("full", "sliding_window_4096"),
    "tp_size": 2,
    "pp_size": 2,
    "rank": 0,
    "hash_algo": "xxhash",
    "hash_seed": "42",
    "format_version": RECORD_FORMAT_VERSION + 1,
    "tag": "tenant-a/lora-7",
}


def test_every_namespace_field_changes_the_fingerprint() -> None:
    assert set(CHANGED) == set(TierNamespace.field_names())
    base = NS.fingerprint()
    assert len(base) == 16 and NS.fingerprint() == base  # deterministic
    seen = {base}
    for name, value in CHANGED.items():
        fp = dataclasses.replace(NS, **{name: value}).fingerprint()
        assert fp not in seen, name
        seen.add(fp)


@pytest.mark.parametrize(
    "kw, err",
    [
        ({"model_id": ""}, ValueError),
        ({"k_dtype": 16}, TypeError),
        ({"page_geometry": [2, 16]}, TypeError),
        ({"page_geometry": (2, 0)}, ValueError),
        ({"tokens_per_block": True}, TypeError),
        ({"tp_size": 2, "rank": 2}, ValueError),
        ({"groups": ()}, TypeError),
    ],
)
def test_bad_namespaces_are_typed_errors(kw: dict, err: type) -> None:
    with pytest.raises(err):
        dataclasses.replace(NS, **kw)


def _reference_value(fp: bytes, key: bytes, payload: bytes, mac_key: bytes | None) -> bytes:
    """The value format of docs/contract.md §8, built here from the spec (not with the codec)."""
    flags = 1 if mac_key else 0
    fixed = b"KVOT" + struct.pack("<HH", RECORD_FORMAT_VERSION, flags) + fp
    fixed += struct.pack("<HHQ", len(key), 0, len(payload))
    if mac_key:
        digest = hmac.new(mac_key, fixed + bytes(32) + key + payload, hashlib.sha256).digest()
    else:
        digest = xxhash.xxh3_128_digest(fixed + bytes(32) + key + payload) + bytes(16)
    return fixed + digest + key + payload


@pytest.mark.parametrize("mac_key", [None, b"k" * 32])
def test_codec_matches_the_documented_format_and_roundtrips(mac_key: bytes | None) -> None:
    payload = np.arange(5000, dtype=np.uint32).astype(np.uint8)
    key = b"h" * 32 + (3).to_bytes(4, "big")
    codec = RecordCodec(NS.fingerprint(), payload.size, mac_key)
    value = codec.encode(key, payload)
    assert value == _reference_value(NS.fingerprint(), key, payload.tobytes(), mac_key)
    assert len(value) == codec.value_bytes(key)
    assert bytes(codec.check(key, value)) == payload.tobytes()


def test_codec_rejections_name_their_reason() -> None:
    payload = np.full(100, 7, dtype=np.uint8)
    key = b"key-1"
    codec = RecordCodec(NS.fingerprint(), 100)
    good = codec.encode(key, payload)
    cases = {
        "magic": b"KVOX" + good[4:],
        "version": good[:4] + struct.pack("<H", 99) + good[6:],
        "fingerprint": good[:8] + bytes(16) + good[24:],
        "key": codec.encode(b"key-2", payload),
        "truncated": good[:-1],
        "length": good + b"x",
        "checksum": good[:-1] + b"\x08",
    }
    for reason, value in cases.items():
        with pytest.raises(ValueRejected) as exc:
            codec.check(key, value)
        kind = "namespace" if reason in ("version", "fingerprint") else "corrupt"
        assert (exc.value.reason, exc.value.kind, exc.value.delete) == (reason, kind, True)
    # the MAC checks depend on the reader's keys: integrity rejections, never deleted
    signed = RecordCodec(NS.fingerprint(), 100, b"m" * 16).encode(key, payload)
    for reader, value, reason in (
        (RecordCodec(NS.fingerprint(), 100, b"m" * 16), good, "unsigned"),
        (codec, signed, "mac-unverifiable"),
        (RecordCodec(NS.fingerprint(), 100, b"o" * 16), signed, "mac"),
        (RecordCodec(NS.fingerprint(), 100, b"m" * 16), signed[:-1] + b"\x08", "mac"),
    ):
        with pytest.raises(ValueRejected) as exc:
            reader.check(key, value)
        assert (exc.value.reason, exc.value.kind, exc.value.delete) == (reason, "integrity", False)
    with pytest.raises(ValueError, match="integrity_key"):
        RecordCodec(NS.fingerprint(), 100, b"short")
    with pytest.raises(TypeError, match=r"integrity_key\[1\]"):
        RecordCodec(NS.fingerprint(), 100, [b"m" * 16, 3])  # type: ignore[list-item]


def test_key_rotation_first_key_signs_every_key_verifies() -> None:
    payload = np.arange(300, dtype=np.uint16).astype(np.uint8)
    key = b"key-r"
    old, new = b"o" * 20, "n" * 20  # bytes or str (UTF-8)
    by_old = RecordCodec(NS.fingerprint(), payload.size, old).encode(key, payload)
    rotated = RecordCodec(NS.fingerprint(), payload.size, [new, old])
    by_new = rotated.encode(key, payload)
    assert by_new == RecordCodec(NS.fingerprint(), payload.size, new.encode()).encode(key, payload)
    for value in (by_old, by_new):
        assert bytes(rotated.check(key, value)) == payload.tobytes()
    with pytest.raises(ValueRejected) as exc:  # the old key retired: its values are refused, not deleted
        RecordCodec(NS.fingerprint(), payload.size, new).check(key, by_old)
    assert (exc.value.reason, exc.value.delete) == ("mac", False)
