"""Conformance suite for kvoffload kernel backends (see :mod:`kvoffload.testing.test_conformance`)."""
