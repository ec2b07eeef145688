"""mtpbench: benchmark and diagnose multi-token-prediction (MTP) speculative decoding."""

__version__ = "0.1.0"
