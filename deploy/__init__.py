"""Deployment: the local no-Docker Kafka broker (Maven jars) and topic provisioning."""
