"""GPU timing helpers shared by the tuner and the bench: the L2 flush and the busy-GPU cover."""
