"""The shared vocabulary every layer speaks: the request/response types, the error tree, the
datatype table, the statistics a version keeps and the read-only views the data plane hands
out. Imports nothing of inferd outside itself; the request plane is ``inferd.plane``."""
