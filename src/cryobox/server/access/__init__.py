"""Who may call the control plane: API keys and their cache, console sessions, rate and body limits, the front
gate."""
