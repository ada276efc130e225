"""What every task runs around the training code: rendezvous, run record, signals, your own code."""
