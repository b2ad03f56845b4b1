"""Recipes: what a Dockerfile or E2B's template steps ask a build VM to do, in one typed form."""
