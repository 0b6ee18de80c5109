"""Production metrics: RocketMQ's series read from Prometheus and Grafana exports, fitted
into a scenario (calibrate), laid over a run (compare), and a run written back in them
(export)."""
