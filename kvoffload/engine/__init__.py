"""The engine kit, for engines other than vLLM: what vLLM's own scheduler and connector do for vLLM.

* :mod:`kvoffload.engine.scheduler` -- the request lifecycle: lookups, touches, load and store jobs,
  their completion (vLLM's KV-offload semantics); handed any manager.
* :mod:`kvoffload.engine.tiered` -- :class:`~kvoffload.engine.tiered.TieredManager`, the host pool's
  manager with secondary tiers beneath it (its tier jobs and options beside it).
* :mod:`kvoffload.engine.reference` -- a reference engine loop driving all of it the way an inference
  engine does, with every loaded byte checked; the demo runs it.

A vLLM deployment imports none of this (``tests/test_layering.py``).
"""
