"""Benchmarks that print ratios side by side (issue 11). Not part of the product."""
