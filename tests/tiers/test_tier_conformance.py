"""The shipped tier conformance suite (:mod:`kvoffload.testing.test_tier_conformance`) on Redis,
Redis Cluster, disk, and an out-of-tree toy tier found by module path and by entry point."""

from __future__ import annotations

import pytest

from kvoffload.testing import test_tier_conformance as suite
from kvoffload.testing import tier_suite

# every test of the suite, and its fixtures, collected here as this module's own
globals().update({name: getattr(suite, name) for name in dir(suite) if name.startswith("test_")})
harness, store = tier_suite.harness, tier_suite.store

TOY = ("tests.tiers.toy_tier:ToyModulePathHarness", "tests.tiers.toy_tier:ToyEntryPointHarness")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    tier_suite.parametrize_harnesses(metafunc, [*tier_suite.BUILTIN_HARNESSES, *TOY])
