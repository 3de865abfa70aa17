"""oneknob: change one engine knob, find where the result flips, say what it tracks."""

__version__ = "0.3.0"
