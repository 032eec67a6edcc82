"""What a GPU worker runs: the pinned host pool, the transfer worker that launches the kernels of
:mod:`kvoffload.kernels`, and the mapping of load/store jobs onto kernel calls. Never imports
:mod:`kvoffload.cache`."""

from kvoffload.transfer.host_pool import HostPool
from kvoffload.transfer.result import LOAD, STORE, TransferResult
from kvoffload.transfer.worker import TransferWorker

__all__ = ["HostPool", "TransferWorker", "TransferResult", "STORE", "LOAD"]
