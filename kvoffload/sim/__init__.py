"""A small reference engine loop that drives kvoffload the way an inference engine does.

:mod:`kvoffload.sim.engine` holds a paged-KV engine with per-group GPU block pools, a GPU prefix
cache, chunked prefill, decode and preemption; its KV tensors hold a deterministic function of
(token prefix, layer, position), so every block loaded back from the CPU tier is checked byte for
byte. :mod:`kvoffload.sim.workload` generates multi-turn chat workloads and reads request traces;
:mod:`kvoffload.sim.mooncake` reads Mooncake traces. :mod:`kvoffload.sim.cache_replay` replays a
trace's prompt blocks through the manager alone (no engine), :mod:`kvoffload.sim.optimal` gives the
infinite cache and Belady's optimum on the same replay, :mod:`kvoffload.sim.cache_sweep` runs a
policy x capacity sweep of them on several processes.
"""
