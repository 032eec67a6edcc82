"""Can a copy engine copy a host range that crosses from one ``cudaHostRegister`` into the next?

``python bench/probe_host_registration.py`` (CUDA machine): a 64 MiB anonymous mapping registered
as two halves, then as one, and a 4 MiB copy device->host->device across the middle through
``cudaMemcpyAsync`` (torch) and ``cuMemcpyBatchAsync`` (batched). Prints one JSON line per case.
Why :class:`kvoffload.transfer.host_pool.HostPool` ends its registrations on row boundaries and
the data paths split their copies there.
"""

from __future__ import annotations

import json
import mmap

import numpy as np
import torch

from kvoffload.kernels.copy_engine import BatchedCopies, CopyList, TorchCopies, batched_copy_problem


def main() -> None:
    cudart = torch.cuda.cudart()
    size, n = 64 << 20, 4 << 20
    at = size // 2 - n // 2
    engines = {"torch": TorchCopies()}
    if batched_copy_problem() is None:
        engines["batched"] = BatchedCopies()
    for registrations in (2, 1):
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        host = torch.frombuffer(mm, dtype=torch.uint8)
        base, part = host.data_ptr(), size // registrations
        ptrs = [base + i * part for i in range(registrations)]
        for p in ptrs:
            assert int(cudart.cudaHostRegister(p, part, 0x01 | 0x02)) == 0
        for name, engine in engines.items():
            src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
            back = torch.zeros_like(src)
            try:
                with torch.cuda.stream(torch.cuda.Stream()):
                    engine.run([host, src], CopyList(np.array([[0], [at], [1], [0], [n]], dtype=np.int64)))
                    engine.run([back, host], CopyList(np.array([[0], [0], [1], [at], [n]], dtype=np.int64)))
                    torch.cuda.current_stream().synchronize()
                result = "ok" if torch.equal(back, src) else "wrong bytes"
            except Exception as exc:  # noqa: BLE001 - the probe reports what failed
                result = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            print(json.dumps({"registrations": registrations, "engine": name, "result": result}), flush=True)
        for p in ptrs:
            cudart.cudaHostUnregister(p)
        del host
        mm.close()


if __name__ == "__main__":
    main()
