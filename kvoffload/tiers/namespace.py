"""The namespace fingerprint: everything that makes two engines' KV bytes incompatible.

Two engines share tier values only when their :class:`TierNamespace` fingerprints are equal.
The fingerprint is stored in every value's header (see :mod:`kvoffload.tiers.record`) and is
part of every store key / file path, so an engine never even finds a value of another model,
dtype, layout, block geometry, parallel layout, hash algorithm or tenant.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["RECORD_FORMAT_VERSION", "TierNamespace"]

#: Version of kvoffload's host-record byte format; part of the fingerprint and the value header.
RECORD_FORMAT_VERSION = 2

_FINGERPRINT_BYTES = 16


@dataclass(frozen=True)
class TierNamespace:
    """What a tier value's bytes depend on; its :meth:`fingerprint` names the namespace.

    Attributes:
        model_id: the model (name and revision, or a weights digest).
        k_dtype / v_dtype: the K and V cache dtypes (``"float16"``, ``"fp8_e4m3"``...).
        layout: the engine's KV page layout name (``"flash_attn"``, ``"flashinfer"``...).
        page_geometry: the page shape per layer and group (e.g. ``(layers, block_size, heads,
            head_dim)``), any tuple of ints that pins the byte layout of a record.
        tokens_per_block: tokens per offloaded block.
        gpu_blocks_per_block: GPU blocks packed into one offloaded block (record).
        groups: one description per KV-cache group (attention type, sliding window...).
        tp_size / pp_size: tensor- and pipeline-parallel sizes.
        rank: this worker's rank when its bytes are rank-specific (a TP shard), ``None`` when
            every rank's record is the same bytes.
        hash_algo / hash_seed: the block-hash algorithm and its seed (keys are only comparable
            when both match).
        format_version: kvoffload's record format version.
        tag: optional tenant / LoRA adapter tag (``""`` for none).
    """

    model_id: str
    k_dtype: str
    v_dtype: str
    layout: str
    page_geometry: tuple[int, ...]
    tokens_per_block: int
    gpu_blocks_per_block: int = 1
    groups: tuple[str, ...] = ("full",)
    tp_size: int = 1
    pp_size: int = 1
    rank: int | None = None
    hash_algo: str = "sha256"
    hash_seed: str = ""
    format_version: int = RECORD_FORMAT_VERSION
    tag: str = ""

    def __post_init__(self) -> None:
        for name in ("model_id", "k_dtype", "v_dtype", "layout", "hash_algo", "hash_seed", "tag"):
            v = getattr(self, name)
            if not isinstance(v, str):
                raise InvalidTypeError(f"TierNamespace.{name} must be a str, got {type(v).__name__} {v!r}")
        for name in ("model_id", "k_dtype", "v_dtype", "layout", "hash_algo"):
            if not getattr(self, name):
                raise InvalidArgumentError(f"TierNamespace.{name} must be a non-empty str")
        if not isinstance(self.page_geometry, tuple) or not self.page_geometry:
            raise InvalidTypeError(
                f"TierNamespace.page_geometry must be a non-empty tuple of ints, got {self.page_geometry!r}"
            )
        for i, d in enumerate(self.page_geometry):
            check_int(d, f"TierNamespace.page_geometry[{i}]", 1)
        if not isinstance(self.groups, tuple) or not all(isinstance(g, str) for g in self.groups) or not self.groups:
            raise InvalidTypeError(f"TierNamespace.groups must be a non-empty tuple of str, got {self.groups!r}")
        check_int(self.tokens_per_block, "TierNamespace.tokens_per_block", 1)
        check_int(self.gpu_blocks_per_block, "TierNamespace.gpu_blocks_per_block", 1)
        tp = check_int(self.tp_size, "TierNamespace.tp_size", 1)
        pp = check_int(self.pp_size, "TierNamespace.pp_size", 1)
        check_int(self.format_version, "TierNamespace.format_version", 1)
        if self.rank is not None:
            r = check_int(self.rank, "TierNamespace.rank", 0)
            if r >= tp * pp:
                raise InvalidArgumentError(f"TierNamespace.rank must be < tp_size * pp_size = {tp * pp}, got {r}")

    def describe(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (what the fingerprint hashes)."""
        d = asdict(self)
        d["page_geometry"] = list(self.page_geometry)
        d["groups"] = list(self.groups)
        return d

    def fingerprint(self) -> bytes:
        """16 bytes: BLAKE2b of the canonical JSON of :meth:`describe` (field order fixed)."""
        canon = json.dumps(self.describe(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.blake2b(canon, digest_size=_FINGERPRINT_BYTES, person=b"kvoffload-ns").digest()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the fields, in declaration order."""
        return tuple(f.name for f in fields(cls))
