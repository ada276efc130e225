"""Executors that start the worker on every task: ``local`` (processes here) and ``slurm``."""
