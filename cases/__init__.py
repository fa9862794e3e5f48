"""The harness's data (known divergences, tolerances, accuracy budgets, shape families, value
domains), shipped as package data and read through importlib.resources (rlx_conformance.core.data)."""
