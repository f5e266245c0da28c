"""Loaded by every Python process started with this folder on PYTHONPATH (the
worker processes of a slot-checked run): checks their scripts and
transactions too (see :mod:`saga_store.testing.slots`)."""

from saga_store.testing.slots import install_from_env

install_from_env()
