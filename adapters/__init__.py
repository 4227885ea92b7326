"""Broker adapters, importable as ``iqbridge.adapters.<name>``."""
