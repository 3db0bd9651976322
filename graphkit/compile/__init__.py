"""Configs, graphs and parameters back into runnable models; arrives with issue #4."""
