"""``inferd tune``: measure a grid of serving configurations of one model on a running server
and write the fastest ``config.pbtxt`` that meets a p99 latency budget."""
