"""The experiment spec: frozen dataclasses, the YAML edge, the dataset catalog."""
