"""A small reference engine loop that drives kvoffload the way an inference engine does.

:mod:`~kvoffload.engine.reference.engine` holds a paged-KV engine with per-group GPU block pools, a
GPU prefix cache, chunked prefill, decode and preemption; its KV tensors hold a deterministic
function of (token prefix, layer, position), so every block loaded back from the CPU tier is checked
byte for byte. :mod:`~kvoffload.engine.reference.workload` generates multi-turn chat workloads and
reads request traces.
"""
