"""Integrations with training frameworks. Each submodule imports its framework when it is imported itself;
``import ngvi`` imports none of them (``ngvi.integrations.hf``: the ``hf`` extra)."""
