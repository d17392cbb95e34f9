"""Model repositories: storage, layout, configuration, and the manager that loads models."""
