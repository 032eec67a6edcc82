"""Data path: Triton pack/unpack kernels, their torch reference, the backend registry.

Imports nothing else of kvoffload except :mod:`kvoffload.errors`: kernels know bytes and block
ids, not keys.
"""
