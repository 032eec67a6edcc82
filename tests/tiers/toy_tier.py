"""An out-of-tree tier, as a third party would write one: values in a process-wide dict per store name.

``ToyTier`` opens ``toy://<store>``; kvoffload finds it by module path
(``{"type": "ToyTier", "module_path": "tests.tiers.toy_tier", "url": "toy://s"}``) or, once
:func:`install_entry_point` has put a distribution declaring it on ``sys.path``, by its scheme
``toy`` (entry-point group ``kvoffload.tiers``). The harnesses run it through kvoffload's tier
conformance suite both ways.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from kvoffload.errors import InvalidArgumentError
from kvoffload.testing.tier_harness import TierHarness
from kvoffload.tiers import ENTRY_POINT_GROUP, Tier, TierNamespace, TierSpec
from kvoffload.tiers.base import FAILED, PRESENT, STORED
from kvoffload.tiers.health import TierUnavailable
from kvoffload.tiers.record import ValueRejected


class ToyStore:
    """One store: values by key, a switch that makes it unreachable, a gate that stalls it."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.lock = threading.Lock()
        self.down = False
        self.gate = threading.Event()
        self.gate.set()

    def enter(self) -> None:
        if not self.gate.wait(timeout=0.5) or self.down:
            raise TierUnavailable("toy store unreachable")


STORES: dict[str, ToyStore] = {}


class ToyTier(Tier):
    """A tier on the in-process store named by ``url`` (``toy://<store>``, or any scheme it is
    registered under)."""

    def __init__(self, records: np.ndarray | memoryview, namespace: TierNamespace, url: str, **tier_options: Any):
        self.options_from_url(url)
        tier_options.setdefault("name", url)
        super().__init__(records, namespace, **tier_options)
        self.store = STORES.setdefault(url, ToyStore())
        self._prefix = self.fingerprint

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        scheme, sep, name = url.partition("://") if isinstance(url, str) else ("", "", "")
        if not scheme or not sep or not name or "/" in name:
            raise InvalidArgumentError(f"url must be <scheme>://<store>, got {url!r}")
        return {"url": url}

    def store_key(self, key: bytes) -> bytes:
        return self._prefix + key

    def _probe(self, keys: list[bytes]) -> list[bool]:
        self.store.enter()
        with self.store.lock:
            return [self._prefix + k in self.store.values for k in keys]

    def _store_batch(self, keys: list[bytes], slots: np.ndarray) -> list[int]:
        self.store.enter()
        out = []
        for key, slot in zip(keys, slots, strict=True):
            payload = self.records[slot]
            value = self.codec.header(key, payload) + payload.tobytes()
            with self.store.lock:
                if self._prefix + key in self.store.values:
                    out.append(PRESENT)
                    continue
                self.store.values[self._prefix + key] = value
            out.append(STORED)
        return out or [FAILED] * len(keys)

    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        self.store.enter()
        ok = []
        for key, slot in zip(keys, slots, strict=True):
            with self.store.lock:
                value = self.store.values.get(self._prefix + key)
            if value is None:
                self.counters.count("absent")
                ok.append(False)
                continue
            try:
                payload = self.codec.check(key, memoryview(value))
            except ValueRejected as rej:
                self.counters.rejected(rej)
                if rej.delete:
                    with self.store.lock:
                        self.store.values.pop(self._prefix + key, None)
                    self.counters.count("deleted_values")
                ok.append(False)
                continue
            self.records[slot] = np.frombuffer(payload, dtype=np.uint8)
            ok.append(True)
        return ok

    def _close_backend(self) -> None:
        return


_names = itertools.count()


class ToyModulePathHarness(TierHarness):
    """The toy tier named by module path (no registration)."""

    can_go_away = True
    can_stall = True

    def setup(self, workdir: Path) -> None:
        super().setup(workdir)
        self.url = f"toy://store-{next(_names)}"

    def reset(self) -> None:
        self.resume()
        STORES.pop(self.url, None)

    def spec(self) -> TierSpec:
        return {"type": "ToyTier", "module_path": "tests.tiers.toy_tier", "url": self.url}

    def _store(self) -> ToyStore:
        return STORES.setdefault(self.url, ToyStore())

    def read_raw(self, tier: Tier, key: bytes) -> bytes | None:
        return self._store().values.get(tier.store_key(key))  # type: ignore[attr-defined]

    def write_raw(self, tier: Tier, key: bytes, value: bytes) -> None:
        self._store().values[tier.store_key(key)] = value  # type: ignore[attr-defined]

    def delete_raw(self, tier: Tier, key: bytes) -> None:
        self._store().values.pop(tier.store_key(key), None)  # type: ignore[attr-defined]

    def go_away(self) -> None:
        self._store().down = True

    def come_back(self) -> None:
        self._store().down = False
        self._store().values.clear()  # back empty, as a restarted server

    def stall(self) -> None:
        self._store().gate.clear()

    def resume(self) -> None:
        self._store().gate.set()


ENTRY_POINTS = f"[{ENTRY_POINT_GROUP}]\ntoy = tests.tiers.toy_tier:ToyTier\n"


def install_entry_point(directory: Path) -> None:
    """Put a distribution declaring ``toy`` in the entry-point group on ``sys.path`` (as
    ``pip install`` of a package with ``[project.entry-points."kvoffload.tiers"]`` would)."""
    info = directory / "kvoffload_toy_tier-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvoffload-toy-tier\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    if str(directory) not in sys.path:
        sys.path.append(str(directory))
    importlib.invalidate_caches()


class ToyEntryPointHarness(ToyModulePathHarness):
    """The toy tier found by its URL scheme through the entry point."""

    def setup(self, workdir: Path) -> None:
        super().setup(workdir)
        install_entry_point(workdir / "site")

    def spec(self) -> TierSpec:
        return self.url


class UncheckedToyTier(ToyTier):
    """A broken tier: loads copy whatever value they find, unchecked (the suite must catch it)."""

    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        self.store.enter()
        ok = []
        for key, slot in zip(keys, slots, strict=True):
            value = self.store.values.get(self._prefix + key)
            if value is not None:
                self.records[slot] = np.frombuffer(value[len(value) - self.record_bytes :], dtype=np.uint8)
            ok.append(value is not None)
        return ok


class UncheckedToyHarness(ToyModulePathHarness):
    def spec(self) -> TierSpec:
        return {"type": "UncheckedToyTier", "module_path": "tests.tiers.toy_tier", "url": self.url}
