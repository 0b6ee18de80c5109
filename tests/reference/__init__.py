"""Independent pure-Python reference models used to check the Spark engine."""
