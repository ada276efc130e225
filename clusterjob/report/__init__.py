"""Tables and reports over results folders (pandas; login-node side, no torch)."""
