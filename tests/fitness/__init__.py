"""Architecture and contract checks: layers, purity, docs, PySyncObj, parity."""
