"""The few device operations the data path needs, in one place, none of which waits for the GPU.

* :func:`upload` -- a host numpy array onto ``device``: through pinned memory and a non-blocking
  copy on the current stream on CUDA (pageable memory would make the copy synchronous).
* :func:`check_not_capturing` -- a typed error instead of a broken CUDA graph when called while
  the current stream is being captured.

Importing this module does not initialise CUDA.
"""

from __future__ import annotations

import numpy as np
import torch

from kvoffload.errors import StreamCaptureError

__all__ = ["upload", "check_not_capturing"]


def upload(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    """``arr`` as a tensor on ``device`` without a host sync (pinned + ``non_blocking`` on CUDA)."""
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)


def check_not_capturing(device: torch.device, what: str) -> None:
    """Raise :class:`StreamCaptureError` if ``device``'s current CUDA stream is capturing a graph."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise StreamCaptureError(
            f"{what} was called while a CUDA graph is being captured on the current stream; KV "
            "transfers cannot be part of a graph: submit them outside the captured region"
        )
