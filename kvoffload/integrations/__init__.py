"""Glue between kvoffload and inference engines (top layer: imports the rest, nothing imports it).

* :mod:`kvoffload.integrations.vllm` -- kvoffload as the backend of vLLM's ``OffloadingConnector``.
  Importing it imports vLLM; ``import kvoffload`` never does.
"""
