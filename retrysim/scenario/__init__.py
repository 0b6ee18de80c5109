"""What the user asked for: the scenario's models, loading and --set, units, limits, errors."""
