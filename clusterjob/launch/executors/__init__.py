"""The executors, one module each (clusterjob.launch.executor finds them all here)."""
