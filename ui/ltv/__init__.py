"""Figures of the Learned task vectors page."""
