"""commsched: schedule gradient communication for faster data-parallel training."""

__version__ = "0.1.0"
