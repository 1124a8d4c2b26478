"""Overhead benchmarks for gym-autoinstr (not tests): run them with ``./run-benchmarks``."""
