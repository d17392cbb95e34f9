"""The control plane: stores (storage), what they hold (catalog), loading (loader), swaps and
unloads (lifecycle), by control mode (manager), and the repository API (control)."""
