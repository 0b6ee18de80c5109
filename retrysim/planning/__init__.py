"""Many runs: sweep grids, targets, and the capacity plan."""
