"""``ts.torch_handler``: the base handler custom handlers subclass."""
