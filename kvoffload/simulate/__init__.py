"""The sizing tool (``python -m kvoffload simulate``): how much host memory and shared cache a
workload needs, and what a fleet of replicas gains from them.

Traces (:mod:`~kvoffload.simulate.mooncake`, :mod:`~kvoffload.simulate.bailian`) become block
traces (:mod:`~kvoffload.simulate.block_trace`), replayed through the manager alone
(:mod:`~kvoffload.simulate.cache_replay`) against the infinite cache and Belady's optimum
(:mod:`~kvoffload.simulate.optimal`), swept over policies and capacities on several processes
(:mod:`~kvoffload.simulate.cache_sweep`), or across replicas with a routing and a shared tier
(:mod:`~kvoffload.simulate.fleet`, :mod:`~kvoffload.simulate.routing`). The command itself, its
report and its plot are :mod:`~kvoffload.simulate.cli`, :mod:`~kvoffload.simulate.report` and
:mod:`~kvoffload.simulate.plot`.
"""
