"""Tools behind the documentation site: the generated reference pages and the runnable examples.

``cli``, ``config`` and ``endpoints`` write the reference pages from the code itself (the
argument parser, the ModelConfig descriptor, the server's router and gRPC services), so they
cannot drift; ``examples`` finds the blocks that the test suite runs (``<!-- run -->``).
"""
