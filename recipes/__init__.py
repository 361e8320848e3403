"""Recipes: applications of chainfb with their own commands (``python -m recipes.<name>``)."""
