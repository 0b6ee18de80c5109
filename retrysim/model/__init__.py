"""The RocketMQ rules without Spark state: flavors, policies, listener behavior, draws, workload."""
