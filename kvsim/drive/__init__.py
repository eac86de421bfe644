"""Drivers that feed a trace to an engine: the sequential replay, the step-clock and timed
replays (the clock, step costs, latencies), and what they return."""
