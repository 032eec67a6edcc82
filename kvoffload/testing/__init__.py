"""Conformance suite for kvoffload kernel backends, shipped with the package.

Run it against any backend -- a registered name (``torch``, ``triton``, ``page_loop``) or an out-of-tree
``module:Class`` subclass of :class:`kvoffload.kernels.registry.KernelBackend` -- with one command::

    python -m pytest -p kvoffload.testing.plugin --pyargs kvoffload.testing --kvoffload-backend=NAME

Options (repeatable): ``--kvoffload-backend NAME`` and ``--kvoffload-device DEVICE`` (default: ``cpu``
and ``cuda``; CUDA cases are skipped without a GPU; a backend that cannot run on a device is skipped
there). The same without the plugin, through environment variables (comma-separated lists)::

    KVOFFLOAD_BACKEND=mypkg.backends:MyBackend KVOFFLOAD_TEST_DEVICE=cuda python -m pytest --pyargs kvoffload.testing

With neither, every built-in backend is tested. ``module:Class`` must be importable (e.g. on
``PYTHONPATH``).

What it checks (:mod:`~kvoffload.testing.test_conformance`): byte-exact ``pack``/``unpack``, and
the kernel the backend binds to a cache and host buffer if it does (``KernelBackend.bind``), for
the flash-attn, flashinfer, MLA and generic (padded block stride) layouts, mixed layouts per group,
fp16/bf16/fp8/fp32, random distinct block ids, a group without tensors, aliased tensors moved once,
host records at 1..16-byte alignments; every host record equals the expected bytes, the source
is unchanged, and no byte outside the written records/pages changes; every bad input of the
contract raises a typed error before anything is written.

**Tiers.** :mod:`~kvoffload.testing.test_tier_conformance` checks a :class:`kvoffload.tiers.Tier`
on a real store: store/load bytes round trip, lookup verdicts (RETRY until the step's probe, then
HIT / MISS, expired verdicts probed again) and one probe round trip per engine step whatever the
number of keys, partial success per key, namespace and integrity rejections (foreign, flipped,
truncated, another key's, unMAC'd values rejected, counted, deleted), concurrent writers of one key
(one writer's bytes, never a mix), drain and close, back-pressure (stores beyond the write budget
dropped at once, counted), a store that goes away and comes back. A tier's author writes a
:class:`~kvoffload.testing.tier_harness.TierHarness` (how to open the tier, reach a raw value,
and optionally take the store away or stall it) and runs::

    python -m pytest -p kvoffload.testing.plugin --pyargs kvoffload.testing.test_tier_conformance \
        --kvoffload-tier=mypkg.testing:MyTierHarness

(or ``KVOFFLOAD_TIER=mypkg.testing:MyTierHarness``); the built-in harnesses are ``redis``,
``redis-cluster`` and ``disk`` (all three by default; the Redis ones need ``redis-server``).

Modules: :mod:`~kvoffload.testing.cases` (KV caches in every layout with independently computed
expected bytes), :mod:`~kvoffload.testing.checks` (byte-exact checks),
:mod:`~kvoffload.testing.bad_inputs` (bad arguments and their errors),
:mod:`~kvoffload.testing.plugin` (the command-line options), :mod:`~kvoffload.testing.tier_harness`
(the stores of the tier suite), :mod:`~kvoffload.testing.tier_suite` (its harness choice and fixtures),
:mod:`~kvoffload.testing.fake_cuda` (the transfer worker's CUDA submit path on a machine without a
GPU: CUDA's calls faked, Triton's compiler real; for tests of the host's work per job).
"""
