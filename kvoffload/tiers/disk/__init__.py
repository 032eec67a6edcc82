"""The disk backend: :class:`DiskTier` (URL scheme ``disk``), one file per block in a directory.

Needs the ``disk`` extra (``pip install 'kvoffload[disk]'``: xxhash, the value format's digest).

* :mod:`~kvoffload.tiers.disk.tier` -- the tier: the directory, its budget, lookups, loads and stores;
* :mod:`~kvoffload.tiers.disk.index` -- the in-memory index of value files, least recently used first;
* :mod:`~kvoffload.tiers.disk.io` -- the file layouts (buffered and O_DIRECT) and whole-value I/O.
"""

from kvoffload.tiers.disk.tier import DiskTier

__all__ = ["DiskTier"]
