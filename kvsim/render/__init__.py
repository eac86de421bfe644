"""All terminal output: rich tables and progress bars, one module per command.

Library code returns data (dicts, frames, results); the commands hand it to a function
here. Library code that was asked to show progress uses :mod:`kvsim.render.progress`.
"""
