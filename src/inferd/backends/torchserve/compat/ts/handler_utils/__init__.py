"""``ts.handler_utils``: decorators for handler methods."""
