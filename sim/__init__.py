"""hyckpt simulation and command line."""
