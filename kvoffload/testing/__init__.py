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

What it checks (:mod:`~kvoffload.testing.test_conformance`): byte-exact ``pack``/``unpack`` for
the flash-attn, flashinfer, MLA and generic (padded block stride) layouts, mixed layouts per group,
fp16/bf16/fp8/fp32, random distinct block ids, a group without tensors, aliased tensors moved once,
host records at 1..16-byte alignments; every host record equals the expected bytes, the source
is unchanged, and no byte outside the written records/pages changes; every bad input of the
contract raises a typed error before anything is written.

Modules: :mod:`~kvoffload.testing.cases` (KV caches in every layout with independently computed
expected bytes), :mod:`~kvoffload.testing.checks` (byte-exact checks),
:mod:`~kvoffload.testing.bad_inputs` (bad arguments and their errors),
:mod:`~kvoffload.testing.plugin` (the command-line options).
"""
