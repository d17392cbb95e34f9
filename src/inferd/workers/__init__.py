"""Several serving processes on one port (``--http-workers``): supervisor, peers, merged figures."""
