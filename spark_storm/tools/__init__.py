"""Tools for running real external servers (a Kafka broker) next to the project."""
