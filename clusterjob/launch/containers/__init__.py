"""Containers around the ranks (docs/design.md, "Containers"): one module per runtime
renders the command line that starts a rank in the spec's image (``render(plan)``),
and clusterjob.launch.containers.plan decides what every runtime gets (the image, the
mounts, the working directory, the variables) and which runtime ``auto`` picks."""
