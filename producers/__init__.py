"""The client SDK other services use to schedule jobs, and the submit CLI."""
