"""What work costs in time on a device: the roofline of a GPU (peak FLOP/s and memory
bandwidth) and the calibration ``kvsim gpu-validate`` fits; the timed replay's step cost
(:mod:`kvsim.drive.step_cost`) and gpu-validate both use them."""
