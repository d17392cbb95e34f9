"""inferd: one-step model deployment and fast inference over KServe v2 and TF Serving APIs."""

__version__ = "0.1.0"
