"""PandaStack's routes that ``/v1`` does not already serve, for its unchanged SDK."""
