"""commsched: schedule gradient communication for faster data-parallel training."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # torch is imported only when the runtime is used.
    if name == "parallelize":
        from commsched.runtime import parallelize

        return parallelize
    raise AttributeError(f"module 'commsched' has no attribute {name!r}")
