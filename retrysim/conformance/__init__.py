"""A scenario on real RocketMQ brokers, compared figure by figure with retrysim
(docs/conformance.md)."""
