"""From a laptop: clusters by name (clusters.yaml), one SSH connection to each, the code
shipped in one rsync, and the commands run there with their output here."""
