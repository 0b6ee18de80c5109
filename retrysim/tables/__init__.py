"""The output tables from the attempts: schemas, transitions, dead letters, load, summary."""
