"""Helpers shared by the test tiers (conftests hold only fixtures; test modules import from here)."""
