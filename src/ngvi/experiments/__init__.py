"""Experiments, each one command of the ``ngvi`` CLI that writes a results folder."""
