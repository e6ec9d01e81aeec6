"""Tests that start no process: the fast loop."""
