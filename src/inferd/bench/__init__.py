"""``inferd bench``: a perf_analyzer-style load generator for any KServe v2 or TF Serving server.

``options`` parses the command line, ``metadata`` asks the server what the model takes,
``inputs`` and ``encode`` build the request bodies once, ``worker`` processes send them
(``transport``: a raw keep-alive HTTP/1.1 client and grpc.aio), ``measure`` turns
measurement windows into one row per load level, ``runner`` drives the sweep and
``report`` writes the table, CSV, JSON and plot.
"""

from __future__ import annotations

from inferd.bench.options import BenchError, add_arguments

__all__ = ["BenchError", "add_arguments"]
