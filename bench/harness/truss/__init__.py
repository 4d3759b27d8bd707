"""Truss's own model server for the Truss tier and its benchmarks, and the models it serves:
``server`` lays a model of ``models/`` out as ``truss`` would build its image and runs it, through
``launch_loopback.py`` (run by ``.venv-truss``'s interpreter, never imported here) on 127.0.0.1.

``models/`` is data for Truss's server (mypy leaves it out; ruff reads it).
"""
