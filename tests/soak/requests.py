"""The soak's requests: random prompts over a few shared prefixes, their chained block hashes."""

from __future__ import annotations

import random

from tests.soak.kv import BLOCK, ROOT, chain_hash
from tests.soak.model import SoakRequest


class RequestSource:
    """Makes and edits requests, recording every block hash it makes.

    Args:
        rng: the soak's random source (three shared prefixes are drawn from it at once).

    Attributes:
        parent: block hash -> (parent hash, the block's tokens), for every hash made.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.parent: dict[bytes, tuple[bytes, tuple[int, ...]]] = {}
        self.prefixes = [[rng.randrange(50) for _ in range(rng.randint(16, 48))] for _ in range(3)]
        self._next_id = 0

    def extend_hashes(self, req: SoakRequest) -> None:
        """Hash the full blocks of ``req`` not hashed yet."""
        while (len(req.block_hashes) + 1) * BLOCK <= len(req.tokens):
            j = len(req.block_hashes)
            prev = ROOT if j == 0 else req.block_hashes[-1]
            toks = tuple(req.tokens[j * BLOCK : (j + 1) * BLOCK])
            h = chain_hash(prev, toks)
            self.parent[h] = (prev, toks)
            req.block_hashes.append(h)

    def new(self) -> SoakRequest:
        """A new request (id ``r<n>``): mostly a shared prefix and a random tail."""
        rng = self.rng
        toks = list(rng.choice(self.prefixes)) if rng.random() < 0.8 else []
        toks += [rng.randrange(50) for _ in range(rng.randint(0 if toks else 1, 24))]
        params = {"max_offload_tokens": rng.choice([0, 8, 17, 40])} if rng.random() < 0.15 else None
        rid = f"r{self._next_id}"
        self._next_id += 1
        req = SoakRequest(rid, toks, len(toks), rng.randint(1, 12), params)
        self.extend_hashes(req)
        return req

    def change_prompt(self, req: SoakRequest) -> None:
        """Keep a random prefix of the prompt, replace the rest."""
        keep = self.rng.randint(0, len(req.tokens))
        req.tokens[keep:] = [self.rng.randrange(50) for _ in range(self.rng.randint(0 if keep else 1, 24))]
        req.num_prompt_tokens = len(req.tokens)
        del req.block_hashes[keep // BLOCK :]
        self.extend_hashes(req)
