"""Deployment: the local no-Docker Kafka broker (Maven jars), the Kafka roles and their grants,
the local stack supervisor (``jobwheel up``) and the compose files. Topic provisioning is Kafka
plumbing: :mod:`jobwheel.kafka.admin`."""
