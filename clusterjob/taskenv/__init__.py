"""The task side of each executor: what a task of its runs asks of it (clusterjob.taskenv.environment)."""
