"""The results folder and the process environment: what both sides of the job read."""
