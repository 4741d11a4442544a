"""Figures of the Soft head selection page."""
