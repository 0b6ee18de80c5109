"""Delta tables and atomic runs: sinks, writer leases, recovery and publishing, readers."""
