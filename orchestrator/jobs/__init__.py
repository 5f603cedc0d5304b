"""A campaign as a Ray job: submit, the job environment, status."""
