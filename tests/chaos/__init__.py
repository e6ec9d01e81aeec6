"""Tests of the chaos harness (jepsen-style/); those that run clusters are marked."""
