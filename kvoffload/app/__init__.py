"""The application on top of the library: the ``kvoffload`` command line (``demo``, ``simulate``,
``bench``, ``info``). Nothing in the library imports it."""
