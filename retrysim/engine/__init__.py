"""The attempts: the round engine, the event-by-event engine, and which of them runs a group."""
