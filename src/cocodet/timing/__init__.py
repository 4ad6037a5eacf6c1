"""Wait/work timing used by training and by mode=bench: the measurement, the transfer timer, the callback."""
