"""Tracking what ran: local run records, MLflow runs, MLPerf ``mllog`` files, late uploads, and the
sweep tables (one row per run, speedups) that reports read.
"""
