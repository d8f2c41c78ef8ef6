"""The embedded default for a laptop and for tests: a Kafka broker from Maven Central jars,
synthetic events from a pipeline's schema, a producer, and a standalone Spark cluster."""
