"""The embedded model's engine: pure numpy, run in a child process."""
