"""Tests that start real node processes on 127.0.0.1 (marked by folder)."""
