"""Putting the parts together: the web app (API, console, MCP, compat front doors), a host agent and a control
plane."""
