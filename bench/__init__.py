"""Benchmarks, run by `make bench` in their own environment (bench/.env); never by `make test`."""
