"""The built-in DDP + AMP trainer."""
