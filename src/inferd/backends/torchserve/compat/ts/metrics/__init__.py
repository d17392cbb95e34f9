"""``ts.metrics``: the metric types and dimensions handlers record through ``context.metrics``."""
