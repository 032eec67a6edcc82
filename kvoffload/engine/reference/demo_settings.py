"""The demo's sizes (:class:`DemoSettings`), shared by ``demo``, ``simulate`` and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.engine.reference.workload import ChatWorkload

__all__ = ["DemoSettings"]


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of the demo; the defaults run in well under a minute on a 2-core CPU.

    ``verify_loads``: the engine checks every block a load brings to the device against the KV it
    computes for it (what the demo is for; a benchmark may turn it off to time an engine that
    trusts its loads, as a real one does).
    """

    conversations: int = 128
    turns: int = 6
    system_prompts: int = 3
    gpu_block_size: int = 16
    block_size_factor: int = 2
    num_layers: int = 8
    num_heads: int = 8
    head_dim: int = 64
    gpu_blocks: int = 512
    cpu_blocks: int = 1536
    max_concurrent: int = 16
    policy: str = "lru"
    backend: str | None = None
    seed: int = 0
    tiers: tuple[str, ...] = ()
    verify_loads: bool = True

    def workload(self) -> ChatWorkload:
        """The chat workload these settings describe."""
        return ChatWorkload(
            conversations=self.conversations, turns=self.turns, system_prompts=self.system_prompts, seed=self.seed
        )

    @property
    def token_bytes(self) -> int:
        """KV bytes of one token over all layers (K and V, 16-bit words)."""
        return self.num_layers * 2 * self.num_heads * self.head_dim * 2

    @property
    def gpu_block_bytes(self) -> int:
        """KV bytes of one GPU block over all layers."""
        return self.gpu_block_size * self.token_bytes
